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


def test_a_live_incident_the_daemon_has_not_yet_resolved_ends_where_the_replay_shows_it_ended():
    # the daemon's last evaluation ran before the engine resumed; the replay read every sample since
    live = [{**inc("Stall", "2026-11-29T10:00:05.000Z", None, "live"), "state": "firing", "duration_s": None}]
    replay = [inc("Stall", "2026-11-29T10:00:10.000Z", "2026-11-29T10:00:25.500Z", "replay")]
    (merged,) = merge_incidents(live, replay)
    assert merged["id"] == "live" and merged["state"] == "resolved"
    assert merged["end"] == "2026-11-29T10:00:25.500Z" and merged["duration_s"] == 20.5
    assert live[0]["end"] is None  # the caller's rows are left as they were


def test_a_live_incident_stays_open_when_the_replay_shows_it_firing_again():
    live = [{**inc("Stall", "2026-11-29T10:00:05.000Z", None, "live"), "state": "firing", "duration_s": None}]
    replay = [inc("Stall", "2026-11-29T10:00:10.000Z", "2026-11-29T10:00:25.500Z", "first"),
              inc("Stall", "2026-11-29T10:01:00.000Z", None, "again")]
    assert [(i["id"], i["end"]) for i in merge_incidents(live, replay)] == [("live", None)]
    # and one the daemon already resolved keeps its own end
    done = [{**inc("Stall", "2026-11-29T10:00:05.000Z", "2026-11-29T10:00:20.000Z", "live"), "state": "resolved"}]
    assert [(i["id"], i["end"]) for i in merge_incidents(done, replay)] == [
        ("live", "2026-11-29T10:00:20.000Z"), ("again", None)]
