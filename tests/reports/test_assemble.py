"""assemble + write against a real store: real samples, the real PromQL engine, the real incident evaluator."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vllm_sentinel.agent.diagnosis.incidents import Evaluator
from vllm_sentinel.agent.alerts.rulefile import parse_rule_text
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.reports.assemble import IncidentNotFound, assemble, chart_window, step_for
from vllm_sentinel.reports.write import report_for_incident, write_report

T0 = 1_795_946_400_000  # 2026-11-29T10:00:00Z
INSTANCE = "127.0.0.1:8000"
RULES_TEXT = """
groups:
- name: test
  rules:
  - alert: TestQueue
    expr: max by (instance, model_name) (vllm:num_requests_waiting) > 2
    for: 30s
    labels: {incident: queue_blocking, severity: critical}
    annotations:
      summary: "{{ $labels.instance }}: {{ $value }} requests waiting"
    evidence:
      - signal: waiting_max
        expr: max by (instance, model_name) (vllm:num_requests_waiting)
        threshold: 2
      - signal: kv_usage
        expr: max by (instance, model_name) (vllm:kv_cache_usage_perc)
        threshold: 0.9
        unit: ratio
      - signal: never_scraped
        expr: max by (instance) (vllm:no_such_metric)
    fix:
      - param: --max-num-seqs
        suggest: "8"
        why: slots are full
"""
RULES = parse_rule_text(RULES_TEXT, "test.yaml")


def waiting(minute: float) -> float:
    """0 requests waiting, 10 between minute 8 and 14, 0 after."""
    return 10.0 if 8 <= minute < 14 else 0.0


@pytest.fixture(scope="module")
def built_db(tmp_path_factory) -> Path:
    """A DuckDB file with 20 minutes of samples and the incidents the real evaluator found (built once)."""
    path = tmp_path_factory.mktemp("db") / "sentinel.duckdb"
    s = Store.open(path)
    batches = []
    for i in range(0, 20 * 60, 5):  # 20 minutes every 5 s
        t = T0 + i * 1000
        b = Batch(INSTANCE, t)
        b.add("vllm:num_requests_waiting", {"engine": "0", "model_name": "m"}, waiting(i / 60))
        b.add("vllm:kv_cache_usage_perc", {"engine": "0", "model_name": "m"}, 0.05)
        other = Batch("10.0.0.9:8000", t)  # another instance, must not leak into the charts
        other.add("vllm:num_requests_waiting", {"engine": "0", "model_name": "m"}, 50.0)
        batches += [b, other]
    s.append_many(batches)
    ev = Evaluator(RULES.groups)
    for i in range(0, 20 * 60, 15):
        ev(s, T0 + i * 1000)
    s.close()
    return path


@pytest.fixture
def store(built_db, tmp_path):
    """A private copy of the built database: tests may add rows."""
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(built_db, copy)
    s = Store.open(copy)
    yield s
    s.close()


def _our_incident(store) -> str:
    rows = store.cursor().execute("SELECT id, instance FROM incidents ORDER BY instance").fetchall()
    return next(r[0] for r in rows if r[1] == INSTANCE)


def test_assemble_reads_the_incident_and_its_evidence_as_ranges(store) -> None:
    iid = _our_incident(store)
    data = assemble(store, iid, now_ms=T0 + 20 * 60_000, rules=[RULES])
    inc = data.incident
    assert inc["incident"] == "queue_blocking" and inc["instance"] == INSTANCE and inc["state"] == "resolved"
    start, end = data.window_ms
    assert start < T0 + 8 * 60_000 < T0 + 14 * 60_000 < end
    lines = data.evidence_series["waiting_max"]
    assert len(lines) == 1 and lines[0][0] == {"instance": INSTANCE, "model_name": "m"}
    values = [v for _, v in lines[0][1] if v is not None]
    assert max(values) == 10.0 and min(values) == 0.0  # the other instance's 50 is not here
    assert data.evidence_exprs["waiting_max"].startswith("max by (instance, model_name)")
    assert data.fixes[0]["param"] == "--max-num-seqs" and data.fixes[0]["suggested"] == "8"


def test_missing_sources_are_named(store) -> None:
    data = assemble(store, _our_incident(store), now_ms=T0 + 20 * 60_000, rules=[RULES])
    text = "\n".join(data.missing)
    assert "no NVML series" in text
    assert "no captures table" in text or "no py-spy capture" in text
    assert "no snapshot" in text  # the table exists (migration 3) but liveconfig wrote nothing
    assert "`never_scraped`: no samples" in text


def test_related_incidents_in_the_same_window_are_listed(store) -> None:
    data = assemble(store, _our_incident(store), now_ms=T0 + 20 * 60_000, rules=[RULES])
    assert [r["instance"] for r in data.related] == ["10.0.0.9:8000"]


def test_a_unique_id_prefix_is_enough_and_unknown_ids_say_how_to_find_one(store) -> None:
    iid = _our_incident(store)
    assert assemble(store, iid[:6], now_ms=T0 + 20 * 60_000, rules=[RULES]).incident["id"] == iid
    with pytest.raises(IncidentNotFound, match="diagnose"):
        assemble(store, "nope", now_ms=T0, rules=[RULES])


def test_config_snapshot_in_force_at_the_start_is_used(store) -> None:
    from vllm_sentinel.agent.diagnosis import liveconfig
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--max-model-len", "512"]
    for ts, seqs in ((T0, "2"), (T0 + 19 * 60_000, "64")):  # the later one must not be shown
        cfg = liveconfig.build_live_config(INSTANCE, argv=[*argv, "--max-num-seqs", seqs], ts_ms=ts)
        assert liveconfig.save_snapshot(store, cfg, ts)
    data = assemble(store, _our_incident(store), now_ms=T0 + 20 * 60_000, rules=[RULES])
    snap = data.config
    assert snap.ts_ms == T0 and snap.model == "/m"
    assert snap.flags["--max-num-seqs"] == "2" and snap.origins["--max-num-seqs"] == "command line"
    assert "--max-num-seqs" not in snap.defaulted
    assert snap.flags["--scheduling-policy"] == "fcfs" and "--scheduling-policy" in snap.defaulted
    assert snap.origins["--scheduling-policy"] == "vLLM default"
    assert "block_size" in snap.unknown  # no cache_config_info: said, not guessed
    text = write_report(data, store_dir := Path(store.path).parent / "out").markdown.read_text()
    assert "- vllm serve /m --max-model-len 512 --max-num-seqs 2\n+ vllm serve /m --max-model-len 512 " \
           "--max-num-seqs 8\n" in text
    assert "| `--max-num-seqs` | 2 | command line |" in text and store_dir.exists()


def test_captures_linked_to_the_incident_are_summarised(store) -> None:
    iid = _our_incident(store)
    cur = store.cursor()  # the captures table comes with the store's migrations
    folded = ("thread (1): MainThread;run_engine_core (vllm/v1/engine/core.py:700);"
              "step (vllm/v1/engine/core.py:674);schedule (vllm/v1/core/sched/scheduler.py:210) 30\n"
              "thread (1): MainThread;run_engine_core (vllm/v1/engine/core.py:700);"
              "step (vllm/v1/engine/core.py:674);execute_model (vllm/v1/executor/abstract.py:90) 70\n")
    cur.execute("INSERT INTO captures (capture_id, ts, instance, incident_id, pid, role, kind, status, samples, "
                "folded) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ["c1", T0 + 9 * 60_000, INSTANCE, iid, 77, "engine_core", "record", "ok", 100, folded])
    data = assemble(store, iid, now_ms=T0 + 20 * 60_000, rules=[RULES])
    [p] = data.stacks
    assert p.role == "engine_core" and p.samples == 100
    assert p.top_frames[0][0].startswith("execute_model") and p.top_frames[0][1] == pytest.approx(0.7)
    assert sum(p.class_shares.values()) == pytest.approx(1.0)
    assert not any("Stacks" in m for m in data.missing)


def test_write_report_from_the_store_end_to_end(store, tmp_path) -> None:
    data = assemble(store, _our_incident(store), now_ms=T0 + 20 * 60_000, rules=[RULES])
    out = write_report(data, tmp_path)
    text = out.markdown.read_text()
    assert "# queue_blocking on 127.0.0.1:8000 (critical, resolved)" in text
    assert "- vllm serve m --max-num-seqs 8" not in text and "+ vllm serve m --max-num-seqs 8" in text
    assert [p.name for p in out.charts] == ["chart-waiting_max.png", "chart-kv_usage.png"]


def test_window_and_step() -> None:
    assert chart_window(600_000, 660_000, 10**9) == (300_000, 960_000)
    assert chart_window(600_000, None, 700_000) == (300_000, 700_000)  # firing: up to now
    assert chart_window(600_000, 660_000, 700_000) == (300_000, 700_000)  # never past now
    assert step_for((0, 20 * 60_000)) == 5_000 and step_for((0, 60_000)) == 1_000


def test_report_for_incident_rewrites_the_same_folder(store, tmp_path) -> None:
    # the sidecar writes once when an incident fires and again when it resolves: same place, newer text
    iid = _our_incident(store)
    first = report_for_incident(store, iid, tmp_path, now_ms=T0 + 10 * 60_000, rules=[RULES])
    second = report_for_incident(store, iid, tmp_path, now_ms=T0 + 20 * 60_000, rules=[RULES])
    assert first.markdown == second.markdown
    assert "10:20:00 UTC" in second.markdown.read_text()


def test_why_no_capture_was_taken_comes_from_the_collectors_event(store) -> None:
    from vllm_sentinel.collectors.base import Event
    b = Batch(INSTANCE, T0 + 9 * 60_000)
    b.events.append(Event(T0 + 9 * 60_000, INSTANCE, "pyspy_capture", {"status": "py_spy_missing"},
                          "py-spy is not installed or not on PATH: `pip install py-spy`"))
    store.append(b)
    data = assemble(store, _our_incident(store), now_ms=T0 + 20 * 60_000, rules=[RULES])
    assert any("no py-spy capture was taken for this incident (py-spy is not installed" in m for m in data.missing)


def test_vllm_profiler_traces_are_listed_apart_from_the_stacks(store, tmp_path) -> None:
    from vllm_sentinel.agent.diagnosis.captures import save_profile
    from vllm_sentinel.collectors.profiler import ProfileCapture
    iid = _our_incident(store)
    trace = str(tmp_path / "traces" / "rank0.pt.trace.json.gz")
    save_profile(store, ProfileCapture("p1", T0 + 9 * 60_000, INSTANCE, "torch_profile", "ok", incident_id=iid,
                                       duration_ms=3_100, artifact=str(tmp_path / "traces"), files=[trace]))
    save_profile(store, ProfileCapture("p2", T0 + 9 * 60_000 + 5, INSTANCE, "nsys", "not_under_nsys",
                                       incident_id=iid, error="vLLM does not run under `nsys launch`"))
    data = assemble(store, iid, now_ms=T0 + 20 * 60_000, rules=[RULES])
    assert data.stacks == []  # a trace is not a py-spy capture with 0 samples
    assert [(t["kind"], t["status"], t["files"]) for t in data.traces] == [
        ("torch_profile", "ok", [trace]), ("nsys", "not_under_nsys", [])]
    text = write_report(data, tmp_path / "out").markdown.read_text()
    assert f"vLLM's torch profiler at 10:09:00, 3.1 s: trace in `{tmp_path / 'traces'}` (1 file)." in text
    assert "Nsight Systems (via vLLM's cuda profiler) at 10:09:00: not taken (not_under_nsys): vLLM does not" in text
