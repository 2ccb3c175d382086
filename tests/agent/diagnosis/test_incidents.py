"""Incidents: the live evaluator's table and the window replay agree, `for` boundaries included."""

from __future__ import annotations

import json

import pytest

from vllm_sentinel.agent.diagnosis.fix_registry import Fix, register_fix
from vllm_sentinel.agent.diagnosis.fixes import FIXES
from vllm_sentinel.agent.diagnosis.incidents import (Evaluator, evaluate_window, incident_id, stored_incidents,
                                                     window_evaluator)
from vllm_sentinel.agent.promql.notation import load_input_series
from vllm_sentinel.agent.alerts.rulefile import parse_rule_text
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.timefmt import iso_precise

S = 1000
RULES = """\
groups:
- name: g
  rules:
  - alert: QueueHigh
    expr: vllm:num_requests_waiting > 1
    for: {for_}
    labels: {{incident: queue_blocking, severity: critical}}
    annotations: {{summary: "{{{{ $labels.instance }}}}: {{{{ $value }}}} waiting"}}
    evidence:
    - {{signal: waiting, expr: 'max by (instance) (vllm:num_requests_waiting)', threshold: 1, unit: requests}}
    - {{signal: running, expr: 'vllm:num_requests_running', unit: requests}}
    fix:
    - {{param: --max-num-seqs, compute: test_double_seqs}}
    - {{param: --scheduling-policy, suggest: priority, why: let short requests pass}}
"""


@register_fix("test_double_seqs")
def _double(config, evidence):
    seqs = config.get("max_num_seqs")
    if seqs is None:
        return None
    return Fix("--max-num-seqs", str(seqs), str(seqs * 2), f"{evidence['waiting']:g} requests wait")


def rules(for_: str = "25s"):
    return [parse_rule_text(RULES.format(for_=for_), "q.yaml")]


@pytest.fixture
def store():
    s = Store.open(":memory:")
    # 5 s steps from 0: waiting is 3..8 for 55s..80s (6 samples), 0 otherwise; instance b never waits
    load_input_series(s, [
        {"series": 'vllm:num_requests_waiting{instance="a:8000",model_name="m"}', "values": "0x10 3 4 8 5 4 3 0x20"},
        {"series": 'vllm:num_requests_running{instance="a:8000",model_name="m"}', "values": "2x30"},
        {"series": 'vllm:num_requests_waiting{instance="b:8000",model_name="m"}', "values": "0x30"},
    ], 5 * S)
    yield s
    s.close()


def config_for(instance):
    return {"max_num_seqs": 4} if instance == "a:8000" else {}


def test_for_boundary_pair_in_window(store) -> None:
    # true for 55s..80s: active 25s at the last true step, so for=25s fires and for=30s never does
    [inc] = evaluate_window(store, 0, 150 * S, None, rules("25s"))
    assert (inc["start"], inc["end"], inc["state"]) == (iso_precise(80 * S), iso_precise(85 * S), "resolved")
    assert evaluate_window(store, 0, 150 * S, None, rules("30s")) == []


def test_window_incident_in_the_diagnose_contract(store) -> None:
    [inc] = evaluate_window(store, 0, 150 * S, None, rules("10s"), config_for=config_for)
    assert inc["incident"] == "queue_blocking" and inc["rule"] == "QueueHigh" and inc["severity"] == "critical"
    assert inc["instance"] == "a:8000" and inc["labels"] == {"model_name": "m"}
    assert (inc["start"], inc["end"]) == (iso_precise(65 * S), iso_precise(85 * S))
    assert inc["peak"] == 8.0 and inc["summary"] == "a:8000: 3 waiting"  # last firing evaluation's text
    # evidence is read at the peak (65 s: 8 waiting), matched to the alert's instance
    assert [{k: v for k, v in e.items() if k != "expr"} for e in inc["evidence"]] == [
        {"signal": "waiting", "value": 8.0, "threshold": 1.0, "unit": "requests"},
        {"signal": "running", "value": 2.0, "threshold": None, "unit": "requests"}]
    assert all(e["expr"] for e in inc["evidence"])  # a report can chart it after the rule file changed
    assert inc["fixes"] == [
        {"param": "--max-num-seqs", "current": "4", "suggested": "8", "why": "8 requests wait"},
        {"param": "--scheduling-policy", "current": None, "suggested": "priority", "why": "let short requests pass"}]
    assert inc["id"] == incident_id("QueueHigh", {"alertname": "QueueHigh", "incident": "queue_blocking",
                                                  "severity": "critical", "instance": "a:8000", "model_name": "m"},
                                    65 * S)
    json.dumps(inc)  # JSON-safe


def test_window_finds_incidents_that_came_and_went_and_filters_instance(store) -> None:
    assert len(evaluate_window(store, 30 * S, 120 * S, None, rules("10s"))) == 1
    assert evaluate_window(store, 90 * S, 150 * S, None, rules("10s")) == []  # resolved before the window
    assert evaluate_window(store, 0, 150 * S, "b:8000", rules("10s")) == []
    ev = window_evaluator(rules("10s"))
    assert [i["instance"] for i in ev(store, 0, 150 * S, "a:8000")] == ["a:8000"]


def test_window_still_firing_at_its_end(store) -> None:
    [inc] = evaluate_window(store, 0, 70 * S, None, rules("10s"))
    assert (inc["state"], inc["end"]) == ("firing", None)


def test_live_evaluator_keeps_the_incidents_table(store) -> None:
    ev = Evaluator(rules("10s"), config_for=config_for)
    opened, resolved = [], []
    for t in range(0, 150 * S, 5 * S):
        r = ev(store, t)
        assert r["errors"] == []
        opened += r["opened"]
        resolved += r["resolved"]
        if t == 70 * S:
            assert r["active"] == {("queue_blocking", "critical"): 1}
            [live] = stored_incidents(store, 0, t)
            assert live["state"] == "firing" and live["end"] is None
    assert len(opened) == 1 and resolved == opened
    [row] = stored_incidents(store, 0, 150 * S)
    # the same episode as the window replay finds, with the same id
    [replayed] = evaluate_window(store, 0, 150 * S, None, rules("10s"), config_for=config_for)
    assert row == replayed
    assert stored_incidents(store, 90 * S, 150 * S) == []
    assert stored_incidents(store, 0, 150 * S, "b:8000") == []


def test_live_evaluator_writes_alerts_series(store) -> None:
    from vllm_sentinel.agent.promql.engine import Engine

    ev = Evaluator(rules("10s"))
    for t in range(0, 75 * S, 5 * S):
        ev(store, t)
    [s] = Engine(store).instant('ALERTS{alertname="QueueHigh"}', 70 * S)
    assert s.labels["alertstate"] == "firing" and s.value == 1.0


def test_open_incident_survives_a_restart(store) -> None:
    first = Evaluator(rules("10s"))
    for t in range(0, 75 * S, 5 * S):
        first(store, t)
    second = Evaluator(rules("10s"))  # a new sidecar process: alert state starts over as pending
    r = second(store, 75 * S)
    assert r["resolved"] == [] and len(second.open) == 1
    r = second(store, 85 * S)  # condition gone: the episode that started before the restart ends
    [row] = stored_incidents(store, 0, 150 * S)
    assert r["resolved"] == [row["id"]] and row["end"] == iso_precise(85 * S)


def test_unregistered_fix_function_says_so(store) -> None:
    text = RULES.format(for_="10s").replace("test_double_seqs", "nope")
    [inc] = evaluate_window(store, 0, 150 * S, None, [parse_rule_text(text, "q.yaml")])
    assert "fix function 'nope' is not registered" in inc["fixes"][0]["why"]
    assert "test_double_seqs" in FIXES


RECORDED = """\
groups:
- name: r
  rules:
  - record: instance:waiting:max
    expr: max by (instance) (vllm:num_requests_waiting)
  - alert: QueueHighRecorded
    expr: instance:waiting:max > 1
    for: 10s
    labels: {incident: queue_blocking, severity: critical}
    annotations: {summary: "{{ $labels.instance }} waits"}
    evidence: [{signal: waiting, expr: 'instance:waiting:max', unit: requests}]
"""


def test_window_replays_recording_rules_the_store_lacks(store) -> None:
    from vllm_sentinel.agent.alerts.backfill import needs_replay

    rf = [parse_rule_text(RECORDED, "r.yaml")]
    assert needs_replay(store, rf[0].groups)  # history nobody evaluated: no instance:waiting:max stored
    [inc] = evaluate_window(store, 0, 150 * S, None, rf)
    assert (inc["rule"], inc["start"], inc["end"], inc["peak"]) == ("QueueHighRecorded", iso_precise(65 * S), iso_precise(85 * S), 8.0)
    assert inc["evidence"][0]["value"] == 8.0
    # once the sidecar has recorded the series, the window reads them from the store itself
    ev = Evaluator(rf)
    for t in range(0, 150 * S, 5 * S):
        ev(store, t)
    assert not needs_replay(store, rf[0].groups)
    [again] = evaluate_window(store, 0, 150 * S, None, rf)
    assert again == inc == stored_incidents(store, 0, 150 * S)[0]


def test_replayed_recording_series_go_stale_like_prometheus(store) -> None:
    from vllm_sentinel.agent.promql.engine import Engine
    from vllm_sentinel.agent.alerts.backfill import replay_store

    text = RECORDED.replace("max by (instance) (vllm:num_requests_waiting)",
                            "vllm:num_requests_waiting > 1")
    mem = replay_store(store, parse_rule_text(text, "r.yaml").groups, 0, 150 * S, 5 * S, Engine)
    try:
        e = Engine(mem)
        assert [s.value for s in e.instant("instance:waiting:max", 80 * S)] == [3.0]
        # gone at 85 s: a staleness marker, not 5 minutes of the last value
        assert e.instant("instance:waiting:max", 90 * S) == []
    finally:
        mem.close()
