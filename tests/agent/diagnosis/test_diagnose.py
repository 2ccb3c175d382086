"""diagnose's merge of live-recorded incidents with those the window replay finds."""

from vllm_sentinel.agent.diagnosis.diagnose import merge_incidents


def inc(rule, start, end, iid, instance="a:1", labels=None):
    return {"id": iid, "rule": rule, "instance": instance, "labels": labels or {}, "start": start, "end": end}


def test_the_live_row_wins_over_an_overlapping_replay_of_the_same_alert():
    live = [inc("Down", "2026-11-29T10:00:05Z", "2026-11-29T10:00:20Z", "live")]
    replay = [inc("Down", "2026-11-29T10:00:15Z", None, "replay")]
    assert [i["id"] for i in merge_incidents(live, replay)] == ["live"]


def test_replayed_incidents_the_daemon_did_not_see_are_kept_in_time_order():
    live = [inc("Down", "2026-11-29T10:00:05Z", "2026-11-29T10:00:20Z", "live")]
    replay = [inc("Down", "2026-11-29T10:05:00Z", None, "later"),          # another episode
              inc("Down", "2026-11-29T10:00:06Z", None, "other", instance="b:1"),  # another instance
              inc("Queue", "2026-11-29T09:59:00Z", "2026-11-29T10:01:00Z", "rule")]  # another rule
    assert [i["id"] for i in merge_incidents(live, replay)] == ["rule", "live", "other", "later"]
