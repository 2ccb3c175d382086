"""Episodes: grouping by instance and overlap, caused_by from the pack's links, roots first; and the
KV-pressure episode of the recorded real session (reports/recordings/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.agent.alerts.explains import CausalLink, CausalLinks
from vllm_sentinel.agent.alerts.rulefile import load_rule_files
from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.demo.replay import run_replay
from vllm_sentinel.agent.diagnosis.episodes import episodes_of, explaining, link_episodes
from vllm_sentinel.collectors.timefmt import iso_seconds

T0 = 1_795_946_400_000  # 2026-11-29T10:00:00Z
KV_LINKS = CausalLinks([CausalLink("kv_cache_pressure", "queue_blocking", ("instance", "model_name")),
                        CausalLink("kv_cache_pressure", "ttft_slo_breach", ("instance", "model_name")),
                        CausalLink("queue_blocking", "ttft_slo_breach", ("instance", "model_name"))])


def inc(iid: str, incident: str, start_s: int, end_s: int | None, instance: str = "a:8000",
        model: str = "m", rule: str = "") -> dict:
    """An incident of the diagnose contract, `start_s`/`end_s` seconds after T0 (None: still firing)."""
    return {"id": iid, "incident": incident, "rule": rule or incident, "severity": "high", "instance": instance,
            "labels": {"model_name": model}, "start": iso_seconds(T0 + start_s * 1000),
            "end": None if end_s is None else iso_seconds(T0 + end_s * 1000),
            "state": "firing" if end_s is None else "resolved", "summary": "", "evidence": [], "fixes": []}


def by_id(incidents: list[dict]) -> dict[str, dict]:
    return {i["id"]: i for i in incidents}


def test_overlapping_incidents_of_one_instance_are_one_episode_with_the_cause_first() -> None:
    out = link_episodes([inc("q", "queue_blocking", 0, 300), inc("k", "kv_cache_pressure", 60, 300),
                         inc("t", "ttft_slo_breach", 120, None)], KV_LINKS)
    assert [i["id"] for i in out] == ["k", "q", "t"]  # the root first, though it started after the queue
    got = by_id(out)
    assert got["k"]["caused_by"] == [] and got["q"]["caused_by"] == ["k"] and got["t"]["caused_by"] == ["q", "k"]
    assert len({i["episode"] for i in out}) == 1
    assert explaining(got["t"], out) == [("queue_blocking", "q"), ("kv_cache_pressure", "k")]


def test_nothing_is_hidden_only_ordered_and_linked() -> None:
    given = [inc("q", "queue_blocking", 0, 300), inc("k", "kv_cache_pressure", 60, 300), inc("x", "underbatched", 9000, None)]
    out = link_episodes(given, KV_LINKS)
    assert sorted(i["id"] for i in out) == ["k", "q", "x"]
    for i in out:
        assert {k: v for k, v in i.items() if k not in ("episode", "caused_by")} == by_id(given)[i["id"]]
    assert [len(e) for e in episodes_of(out)] == [2, 1]


def test_a_gap_within_the_tolerance_joins_an_episode_and_a_longer_one_does_not() -> None:
    given = [inc("k", "kv_cache_pressure", 0, 100), inc("q", "queue_blocking", 190, 400)]  # 90 s apart
    apart = link_episodes(given, KV_LINKS, tolerance_ms=60_000)
    assert len({i["episode"] for i in apart}) == 2 and all(i["caused_by"] == [] for i in apart)
    joined = link_episodes(given, KV_LINKS, tolerance_ms=120_000)
    assert len({i["episode"] for i in joined}) == 1 and by_id(joined)["q"]["caused_by"] == ["k"]


def test_the_onset_counts_the_rules_for() -> None:
    # the TTFT breach fires 2 minutes (its `for`) after its condition began, 100 s after its cause ended
    given = [inc("q", "queue_blocking", 0, 100), inc("t", "ttft_slo_breach", 200, 400, rule="VllmTtftSloBreach")]
    without = link_episodes(given, KV_LINKS, tolerance_ms=0)
    assert by_id(without)["t"]["caused_by"] == []
    links = CausalLinks(KV_LINKS.links, {"VllmTtftSloBreach": 120_000})
    assert by_id(link_episodes(given, links, tolerance_ms=0))["t"]["caused_by"] == ["q"]


def test_two_instances_are_never_one_episode() -> None:
    out = link_episodes([inc("k", "kv_cache_pressure", 0, 300, instance="a:8000"),
                         inc("q", "queue_blocking", 0, 300, instance="b:8000")], KV_LINKS)
    assert len({i["episode"] for i in out}) == 2 and all(i["caused_by"] == [] for i in out)


def test_the_equal_labels_must_agree() -> None:
    out = link_episodes([inc("k", "kv_cache_pressure", 0, 300, model="m1"),
                         inc("q", "queue_blocking", 0, 300, model="m2")], KV_LINKS)
    assert len({i["episode"] for i in out}) == 1  # one instance, overlapping: one episode ...
    assert all(i["caused_by"] == [] for i in out)  # ... but two models: two roots


def test_a_chain_of_overlaps_is_one_episode_and_a_link_needs_the_two_to_overlap() -> None:
    # k overlaps q, q overlaps t; k ended 10 minutes before t began: k does not explain t
    out = link_episodes([inc("k", "kv_cache_pressure", 0, 120), inc("q", "queue_blocking", 60, 1000),
                         inc("t", "ttft_slo_breach", 900, None)], KV_LINKS)
    assert len({i["episode"] for i in out}) == 1
    assert by_id(out)["t"]["caused_by"] == ["q"] and by_id(out)["q"]["caused_by"] == ["k"]


def test_a_chain_of_causes_orders_roots_then_each_level() -> None:
    links = CausalLinks([CausalLink("gpu_fault", "engine_stall", ("instance",)),
                         CausalLink("gpu_fault", "queue_blocking", ("instance",)),
                         CausalLink("engine_stall", "queue_blocking", ("instance",))])
    out = link_episodes([inc("q", "queue_blocking", 0, 300), inc("s", "engine_stall", 30, 200),
                         inc("g", "gpu_fault", 60, None)], links)
    assert [(i["id"], i["caused_by"]) for i in out] == [("g", []), ("s", ["g"]), ("q", ["s", "g"])]


def test_the_episode_id_stays_when_a_later_symptom_joins() -> None:
    first = link_episodes([inc("k", "kv_cache_pressure", 0, None), inc("q", "queue_blocking", 60, None)], KV_LINKS)
    later = link_episodes([inc("k", "kv_cache_pressure", 0, None), inc("q", "queue_blocking", 60, None),
                           inc("t", "ttft_slo_breach", 400, None)], KV_LINKS)
    assert {i["episode"] for i in first} == {i["episode"] for i in later}


def test_a_cycle_of_links_is_refused_when_the_pack_loads(tmp_path: Path) -> None:
    rule = ("groups:\n- name: {g}\n  rules:\n  - alert: {a}\n    expr: up == 0\n"
            "    labels: {{incident: {i}, severity: high}}\n    annotations: {{summary: s}}\n"
            "    explains:\n    - incidents: [{e}]\n      equal: [instance]\n")
    (tmp_path / "a.yaml").write_text(rule.format(g="a", a="A", i="queue_blocking", e="traffic_burst"))
    (tmp_path / "b.yaml").write_text(rule.format(g="b", a="B", i="traffic_burst", e="queue_blocking"))
    with pytest.raises(RuleFileError) as e:
        load_rule_files([tmp_path])
    [problem] = e.value.problems
    assert problem.startswith(f"{tmp_path / 'a.yaml'}:4: explains makes a cycle: ")
    assert "queue_blocking -> traffic_burst -> queue_blocking" in problem and "\n" not in problem


def test_the_kv_pressure_episode_of_the_recorded_real_session() -> None:
    incidents = run_replay()["incidents"]
    [kv] = [i for i in incidents if i["incident"] == "kv_cache_pressure"]
    assert kv["caused_by"] == []  # a root ...
    for name in ("queue_blocking", "ttft_slo_breach"):
        [symptom] = [i for i in incidents if i["incident"] == name]
        assert symptom["episode"] == kv["episode"] and kv["id"] in symptom["caused_by"], symptom
    episode = next(e for e in episodes_of(incidents) if e[0]["episode"] == kv["episode"])
    roots = [i for i in episode if not i["caused_by"]]
    assert episode[:len(roots)] == roots  # roots first, symptoms beneath
