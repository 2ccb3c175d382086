"""Live coverage: what the daemon evaluated live is read back, not replayed; the rest of a window is replayed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vllm_sentinel.agent.alerts.rulefile import parse_rule_text
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.diagnosis import window as window_module
from vllm_sentinel.agent.diagnosis.diagnose import diagnose
from vllm_sentinel.agent.diagnosis.incidents import Evaluator, evaluate_window
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.promql.notation import load_input_series
from vllm_sentinel.agent.store import coverage_table
from vllm_sentinel.agent.store.db import HOUR_MS, Store
from vllm_sentinel.agent.store.ingest import ingest_text
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.collectors.timefmt import iso_seconds

S = 1000
RULES = """\
groups:
- name: g
  rules:
  - alert: QueueHigh
    expr: {expr}
    for: {for_}
    labels: {{incident: queue_blocking, severity: critical}}
"""


def pack(for_: str = "25s", expr: str = "vllm:num_requests_waiting > 1"):
    return [parse_rule_text(RULES.format(for_=for_, expr=expr), "q.yaml")]


@pytest.fixture
def store():
    s = Store.open(":memory:")
    # 5 s steps from 0: instance a waits 3..8 for 55s..80s, 0 otherwise (fires at 80 s with for 25s, ends at 85 s)
    load_input_series(s, [
        {"series": 'vllm:num_requests_waiting{instance="a:8000"}', "values": "0x10 3 4 8 5 4 3 0x20"},
        {"series": 'vllm:num_requests_running{instance="a:8000"}', "values": "2x36"},
    ], 5 * S)
    yield s
    s.close()


def live(store, rules, times_s) -> Evaluator:
    """A daemon's evaluator, run at these times (seconds)."""
    ev = Evaluator(rules)
    for t in times_s:
        ev(store, t * S)
    return ev


def span(a_s: int, b_s: int) -> dict:
    return {"start": iso_seconds(a_s * S), "end": iso_seconds(b_s * S)}


def test_runs_grow_while_evaluations_come_close_and_clip_back_to_late_samples(store):
    for t in range(0, 55, 5):
        coverage_table.extend(store, "p", t * S, 15 * S)
    coverage_table.extend(store, "p", 80 * S, 15 * S)  # 30 s after the last: a new run
    coverage_table.extend(store, "p", 85 * S, 15 * S, new_run=True)
    coverage_table.extend(store, "other", 0, 15 * S)
    assert coverage_table.covered(store, "p", 0, 100 * S) == [(0, 50 * S), (80 * S, 80 * S), (85 * S, 85 * S)]
    assert coverage_table.covered(store, "p", 20 * S, 30 * S) == [(20 * S, 30 * S)]
    assert coverage_table.gaps([(0, 50 * S), (80 * S, 80 * S)], 0, 100 * S) == [(50 * S, 80 * S), (80 * S, 100 * S)]
    assert coverage_table.gaps([], 0, 10) == [(0, 10)]
    assert coverage_table.gaps([(0, 10)], 0, 10) == []
    coverage_table.clip(store, 30 * S)
    assert coverage_table.covered(store, "p", 0, 100 * S) == [(0, 30 * S - 1)]
    assert coverage_table.covered(store, "other", 0, 100 * S) == [(0, 0)]


def test_retention_drops_the_runs_of_dropped_hours(store):
    coverage_table.extend(store, "p", 10 * S, 15 * S)
    late = Batch(instance="a:8000", ts_ms=HOUR_MS + 10 * S)
    late.add("vllm:num_requests_running", {}, 1.0)
    store.append_many([late])
    coverage_table.extend(store, "p", HOUR_MS + 10 * S, 15 * S, new_run=True)
    store.drop_before(HOUR_MS)
    assert coverage_table.covered(store, "p", 0, 2 * HOUR_MS) == [(HOUR_MS + 10 * S, HOUR_MS + 10 * S)]


def test_a_window_the_daemon_covered_is_read_from_its_records_not_replayed(store, monkeypatch):
    rules = pack()
    live(store, rules, range(0, 155, 5))
    replays = []
    monkeypatch.setattr(window_module, "evaluate_window",
                        lambda *a, **k: replays.append(a[1:3]) or evaluate_window(*a, **k))
    doc = diagnose(store, 0, 150 * S, evaluate_window=pack_window_evaluator(rules, reuse_live=True))
    assert replays == []
    assert doc["evaluation"] == {"step_s": 5.0, "live": [span(0, 150)], "replayed": []}
    [inc] = doc["incidents"]
    assert inc["found_by"] == "live"
    # the same incident a replay of the whole window finds
    [replayed] = evaluate_window(store, 0, 150 * S, None, rules)
    assert (inc["id"], inc["start"], inc["end"]) == (replayed["id"], replayed["start"], replayed["end"])
    # without reuse_live (the default) the whole window is replayed, the live record merged in as before
    doc = diagnose(store, 0, 150 * S, evaluate_window=pack_window_evaluator(rules))
    assert doc["evaluation"] == {"step_s": 5.0, "live": [], "replayed": [span(0, 150)]}
    assert [(i["id"], i["found_by"]) for i in doc["incidents"]] == [(inc["id"], "live")]


def test_what_no_daemon_watched_is_replayed_and_said_so(store):
    rules = pack()
    live(store, rules, range(0, 45, 5))  # a daemon watched 0..40 s,
    live(store, rules, range(100, 155, 5))  # then a restarted one 100..150 s; the incident (80..85 s) fell between
    doc = diagnose(store, 0, 150 * S, evaluate_window=pack_window_evaluator(rules, reuse_live=True))
    assert doc["evaluation"]["live"] == [span(0, 40), span(100, 150)]
    assert doc["evaluation"]["replayed"] == [span(40, 100)]
    [inc] = doc["incidents"]
    assert inc["found_by"] == "replay"
    [whole] = evaluate_window(store, 0, 150 * S, None, rules)
    assert (inc["id"], inc["start"], inc["end"]) == (whole["id"], whole["start"], whole["end"])
    # another pack (for: 30s) was never evaluated live: all of its window is replayed
    other = pack("30s")
    assert pack_window_evaluator(other, reuse_live=True).plan(store, 0, 150 * S).replayed == [(0, 150 * S)]


def test_samples_arriving_late_or_ingested_take_back_the_coverage_of_their_time(store):
    rules = pack()
    ev = live(store, rules, range(0, 155, 5))
    late = Batch(instance="a:8000", ts_ms=30 * S)
    late.add("vllm:num_requests_running", {"engine": "1"}, 5.0)
    store.append_many([late])  # written at 150 s for 30 s: evaluations from 30 s on did not see it
    ev(store, 155 * S)
    plan = pack_window_evaluator(rules, reuse_live=True).plan(store, 0, 155 * S)
    assert plan.live == [(0, 30 * S - 1), (155 * S, 155 * S)]
    assert plan.replayed == [(30 * S - 1, 155 * S)]
    ingest_text(store, 'vllm:num_requests_running{instance="a:8000"} 7 10000\n', None, 0)
    assert pack_window_evaluator(rules, reuse_live=True).plan(store, 0, 155 * S).live == [(0, 10 * S - 1)]


def test_an_evaluation_with_a_failing_rule_covers_nothing(store):
    # two series match the one side of on(): an error at every evaluation
    bad = pack(expr="vllm:num_requests_waiting + on() {__name__=~'vllm:num_requests_.*'}")
    ev = live(store, bad, range(0, 55, 5))
    assert ev.pack != Evaluator(pack()).pack
    assert coverage_table.covered(store, ev.pack, 0, 100 * S) == []


def test_the_cli_reuses_live_records_only_when_asked(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store.open(db) as s:
        load_input_series(s, [{"series": 'vllm:num_requests_waiting{instance="a:8000"}',
                               "values": "0x10 3 4 8 5 4 3 0x20"}], 5 * S)
        live(s, load_pack(None), range(0, 155, 5))  # the shipped pack, as the CLI loads it

    def evaluation(*flags: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "vllm_sentinel", "diagnose", "--db", str(db), "--since", "150s",
                              "--until", "150", "--format", "json", *flags], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)["evaluation"]

    assert evaluation()["live"] == []
    assert evaluation("--reuse-live") == {"step_s": 5.0, "live": [span(0, 150)], "replayed": []}
