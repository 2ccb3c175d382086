"""Captures in the store and an incident's `profile`, from real vLLM py-spy recordings."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel.agent.diagnosis.captures import profile_of, save
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors import pyspy as ps

FIXTURES = Path(__file__).parents[2] / "collectors" / "fixtures" / "pyspy"


def recorded(role: str, pid: int, incident_id: str | None, state: str = "R") -> ps.Capture:
    stacks = ps.parse_folded((FIXTURES / f"load-record-{role}.txt").read_text())
    return ps.Capture(capture_id=f"c-{role}", ts_ms=1_000, instance="a:8000", pid=pid, role=role, kind="record",
                      status="ok", stacks=stacks, incident_id=incident_id, process_state=state)


def test_saved_captures_become_the_incidents_profile():
    with Store.open(":memory:") as store:
        taken = ps.TargetCapture("http://a:8000", "a:8000", "ok", None,
                                 [recorded("engine_core", 11, "inc1"), recorded("worker", 12, "inc1", "T")])
        assert save(store, taken) == 2
        assert store.con.execute("SELECT count(*) FROM events WHERE kind = 'pyspy_capture'").fetchone()[0] == 2
        prof = profile_of(store, "inc1")
        assert profile_of(store, "other") is None
    assert prof["kind"] == "py-spy"
    by_role = {p["role"]: p for p in prof["processes"]}
    assert set(by_role) == {"engine_core", "worker"}
    assert by_role["worker"]["stopped"] is True and by_role["engine_core"]["stopped"] is False
    assert any("forward" in f["frame"] for f in by_role["worker"]["top_frames"])  # a worker runs the model
    assert prof["top_frames"] and all(f.split(":")[0] in ("engine_core", "worker") for f in prof["top_frames"])


class FakeVllmHttp:
    """vLLM's profiler routes as 0.32 answers them (checked live in test_pyspy_live); writes a trace on stop."""

    def __init__(self, trace_dir: Path) -> None:
        self.trace_dir = trace_dir
        self.posts: list[str] = []

    def __call__(self, method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, str]:
        if method == "GET":
            return 405, '{"detail":"Method Not Allowed"}'
        self.posts.append(url.rsplit("/", 1)[1])
        if url.endswith("/stop_profile"):
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            (self.trace_dir / f"rank0.{len(self.posts)}.pt.trace.json.gz").write_bytes(b"\x1f\x8b")
        return 200, ""


def test_an_opened_incident_gets_real_stacks_and_at_most_one_vllm_profiler_trace(tmp_path: Path):
    import json
    import subprocess
    import sys
    from types import SimpleNamespace

    from vllm_sentinel.agent.diagnosis.captures import IncidentCapturer, traces_of
    from vllm_sentinel.collectors.process import VllmProcess
    from vllm_sentinel.collectors.profiler import VllmProfiler

    trace_dir = tmp_path / "traces"
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--profiler-config",
            json.dumps({"profiler": "torch", "torch_profiler_dir": str(trace_dir)})]
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    http = FakeVllmHttp(trace_dir)
    try:
        target = SimpleNamespace(target="http://127.0.0.1:8000", instance="127.0.0.1:8000",
                                 processes=[VllmProcess(child.pid, 1, "api_server", "python", argv=argv)])
        capturer = IncidentCapturer(
            {target.instance: target}, profiler_s=0.2, limiter=ps.RateLimiter(per_target_s=0),  # py-spy: every time
            make_profiler=lambda url, inst, **kw: VllmProfiler(url, inst, http=http, **kw))
        opened = {"i1": {"incident": "frontend_cpu_bound", "instance": target.instance},
                  "i2": {"incident": "kv_cache_pressure", "instance": target.instance},  # not stack-explained
                  "i3": {"incident": "queue_blocking", "instance": target.instance},
                  "i4": {"incident": "engine_stall", "instance": target.instance}}
        with Store.open(tmp_path / "s.duckdb") as store:
            capturer.after_evaluation(store, {"opened": ["i1", "i2"]}, opened)
            capturer.after_evaluation(store, {"opened": ["i3", "i4"]}, opened)  # the same target, seconds later
            capturer.close()
            rows = store.con.execute("SELECT incident_id, kind, status FROM captures ORDER BY ts").fetchall()
            traces = traces_of(store, "i1")
            events = store.con.execute("SELECT kind FROM events ORDER BY ts").fetchall()
            prof = profile_of(store, "i1")
    finally:
        child.kill()
        child.wait()
    # py-spy first (its stacks show the incident before the profiler slows the server), then the trace
    # i3: the profiler's own limit (one per target per 10 minutes); i4: a frozen engine gets no profiler
    assert rows == [("i1", "dump", "ok"), ("i1", "torch_profile", "ok"), ("i3", "dump", "ok"), ("i4", "dump", "ok")], rows
    assert http.posts == ["start_profile", "stop_profile"]
    assert "rate_limited" in capturer.last_status["127.0.0.1:8000 profiler"]
    assert traces[0]["artifact"] == str(trace_dir) and traces[0]["files"] == [str(trace_dir / "rank0.2.pt.trace.json.gz")]
    assert events == [("pyspy_capture",), ("profiler_capture",), ("pyspy_capture",), ("pyspy_capture",)]
    assert prof["kind"] == "py-spy" and prof["processes"][0]["role"] == "api_server" and prof["traces"] == traces


def test_over_budget_a_stall_is_still_captured_and_other_kinds_wait(tmp_path: Path):
    """Over the CPU budget a queue_blocking capture waits for a later evaluation; an engine_stall's does
    not (a frozen engine leaves its cores idle, and its stacks exist only until it resumes)."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from vllm_sentinel.agent.diagnosis.captures import IncidentCapturer
    from vllm_sentinel.collectors.process import VllmProcess

    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    asked: list[tuple[str, bool]] = []

    def over_budget(work: str, retry: bool) -> bool:
        asked.append((work, retry))
        return False

    try:
        target = SimpleNamespace(target="http://127.0.0.1:8000", instance="127.0.0.1:8000",
                                 processes=[VllmProcess(child.pid, 1, "engine_core", "python")])
        capturer = IncidentCapturer({target.instance: target}, gate=over_budget)
        opened = {"q": {"incident": "queue_blocking", "instance": target.instance},
                  "s": {"incident": "engine_stall", "instance": target.instance}}
        with Store.open(tmp_path / "s.duckdb") as store:
            capturer.after_evaluation(store, {"opened": ["q", "s"]}, opened)
            capturer.close()
            rows = store.con.execute("SELECT incident_id, status FROM captures").fetchall()
    finally:
        child.kill()
        child.wait()
    assert rows == [("s", "ok")], rows
    assert asked == [("capture", False)]  # only the queue_blocking capture asked, and was refused
    assert capturer.last_status[target.instance] == "ok" and len(capturer._deferred) == 1
