"""Stack evidence against a real vLLM CPU server: discovery, py-spy under load and during a SIGSTOP stall,
vLLM's torch profiler through /start_profile and /stop_profile, and the nsys status."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import re
import time
import urllib.request
from pathlib import Path

import pytest

from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.demo.traffic import BackgroundTraffic, TrafficPlan, run_traffic
from vllm_sentinel.agent.demo.vllm_server import VllmServer
from vllm_sentinel.collectors import frames as fr
from vllm_sentinel.collectors import profiler as prof
from vllm_sentinel.collectors import pyspy as ps
from vllm_sentinel.collectors.process import ProcessCollector, discover

pytestmark = pytest.mark.integration

if ps.find_py_spy() is None:
    pytest.skip("py-spy not installed (pip install py-spy)", allow_module_level=True)


def _load(server: VllmServer, seconds: float = 30) -> BackgroundTraffic:
    plan = TrafficPlan(requests=2000, duration_s=seconds, concurrency=6, prompt_tokens=200, max_tokens=32)
    return BackgroundTraffic(server.url, server.model_name, plan).start()


def _wait_until_serving(server: VllmServer, timeout_s: float = 60) -> None:
    """Block until the engine reports running requests: a capture 'under load' must find load."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:  # noqa: S310 - loopback
            text = resp.read().decode()
        running = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)", text, re.M)
        if running and float(running.group(1)) > 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"no request running on {server.url} within {timeout_s} s of starting traffic")


def _unclassified_vllm_stacks(stacks: dict[str, int]) -> dict[str, int]:
    """Whole stacks through vLLM's code that the classifier leaves in `other` (a record samples running threads)."""
    out = {}
    for stack, n in stacks.items():
        _, frames = fr.split_stack(stack)
        if (fr.complete_stack(frames) and any("vllm/" in f for f in frames)
                and fr.classify_stack(frames, active=True) == fr.OTHER):
            out[stack] = n
    return out


def test_discovery_finds_api_server_engine_core_and_worker(vllm_server: VllmServer):
    procs = discover(vllm_server.url)
    roles = [p.role for p in procs]
    assert roles[0] == "api_server" and procs[0].pid == vllm_server.pid
    assert "engine_core" in roles and "worker" in roles
    assert procs[0].flags()["--port"] == str(vllm_server.port)
    batch = ProcessCollector(vllm_server.url).collect(0)
    assert batch.status is not None and batch.status.ok
    cpu = {lab: v for m, lab, v in zip(batch.metrics, batch.labels, batch.values)
           if m == "vllm_sentinel_process_cpu_seconds_total"}
    assert len(cpu) == len(procs) and all(v > 0 for v in cpu.values())


def test_capture_under_load_has_engine_and_worker_stacks_and_classifies_them(vllm_server: VllmServer):
    procs = discover(vllm_server.url)
    traffic = _load(vllm_server)
    try:
        _wait_until_serving(vllm_server)
        time.sleep(2)  # let the batch fill
        tc = ps.capture_target(vllm_server.url, ps.PySpy(), procs, instance=vllm_server.instance,
                               kind=ps.KIND_RECORD, duration_s=3, incident_id="test-load")
    finally:
        result = traffic.wait(180)
    assert result.ok > 0 and result.failed == 0
    assert tc.status == ps.STATUS_OK, tc.error
    by_role = {c.role: c for c in tc.captures}
    for cap in tc.captures:
        # whole stacks through vLLM's code get a class: a property of the rules, not of the moment. None
        # was left in 27 records per process; the 2 % allows a rare stack no record has shown yet, while
        # a frame the rules stop knowing (the worker's step, the engine's loop) is a tenth or more
        unknown = _unclassified_vllm_stacks(cap.stacks)
        assert sum(unknown.values()) <= 0.02 * max(1, sum(cap.stacks.values())), (cap.role, unknown)
    for role in ("engine_core", "worker"):
        cap = by_role[role]
        assert cap.ok, (role, cap.status, cap.error)
        assert any("vllm/" in s for s in cap.stacks), role
        profile = cap.profile()
        assert profile.samples >= 20, (role, profile.to_dict())
        # `other` is then what py-spy could not read whole: --nonblocking races the running thread and
        # a sample comes back with no frame or cut short. That share depends on timing (0-10% of samples
        # per record in 27 records per process, tests/collectors/fixtures/frames/README.md), so it only
        # has to leave most samples readable: below half, py-spy no longer reads this Python.
        whole = sum(n for s, n in cap.stacks.items() if fr.complete_stack(fr.split_stack(s)[1]))
        assert whole >= 0.5 * profile.samples, (role, whole, profile.to_dict())
    worker_busy = by_role["worker"].profile().busy_shares()
    assert worker_busy.get(fr.MODEL_FORWARD, 0) > 0.3, (worker_busy, by_role["worker"].profile().to_dict())
    assert any("vllm/v1/engine/core.py" in s for s in by_role["engine_core"].stacks)


def test_capture_while_engine_core_is_stopped_shows_where_it_is(vllm_server: VllmServer):
    procs = discover(vllm_server.url)
    engine = next(p for p in procs if p.role == "engine_core")
    traffic = _load(vllm_server, seconds=15)
    time.sleep(3)
    os.kill(engine.pid, signal.SIGSTOP)
    try:
        time.sleep(1)
        tc = ps.capture_target(vllm_server.url, ps.PySpy(), procs, instance=vllm_server.instance,
                               kind=ps.KIND_DUMP, incident_id="test-stall")
    finally:
        os.kill(engine.pid, signal.SIGCONT)
    traffic.wait(180)
    cap = next(c for c in tc.captures if c.role == "engine_core")
    assert cap.ok, (cap.status, cap.error)
    assert cap.stopped and cap.process_state == "T"
    assert "stopped" in cap.to_event().message
    main = cap.profile().main_thread
    assert any("vllm/v1/engine/core.py" in f for f in main), main
    # the server serves again after SIGCONT
    after = run_traffic(vllm_server.url, vllm_server.model_name, TrafficPlan(requests=2, concurrency=1, max_tokens=4))
    assert after.ok == 2


def test_profile_endpoints_absent_without_profiler_config(vllm_server: VllmServer):
    assert prof.endpoints_available(vllm_server.url) is False
    procs = discover(vllm_server.url)
    cap = prof.VllmProfiler(vllm_server.url, vllm_server.instance, enabled=True, api_server=procs[0]).capture(1)
    assert cap.status == prof.STATUS_UNSUPPORTED and "--profiler-config" in cap.error
    off = prof.VllmProfiler(vllm_server.url, vllm_server.instance).capture(1)
    assert off.status == prof.STATUS_DISABLED


@pytest.mark.skipif(shutil.which("nsys") is not None, reason="nsys is installed here")
def test_nsys_absent_is_reported(vllm_server: VllmServer):
    status = prof.detect_nsys(discover(vllm_server.url))
    assert status.status == prof.STATUS_NSYS_MISSING and not status.under_nsys
    assert "Nsight Systems" in status.message


def test_torch_profiler_capture_writes_traces(vllm_server_factory, tmp_path: Path):
    trace_dir = tmp_path / "traces"
    config = {"profiler": "torch", "torch_profiler_dir": str(trace_dir), "torch_profiler_with_stack": False}
    server = vllm_server_factory(extra_args=["--profiler-config", json.dumps(config)])
    assert prof.endpoints_available(server.url) is True
    api = discover(server.url)[0]
    profiler = prof.VllmProfiler(server.url, server.instance, enabled=True, api_server=api)
    assert profiler.trace_dir() == str(trace_dir)
    traffic = _load(server, seconds=10)
    try:
        cap = profiler.capture(duration_s=2, incident_id="test-profile")
    finally:
        traffic.wait(180)
    assert cap.status == prof.STATUS_OK, cap.error
    assert cap.artifact == str(trace_dir)
    assert cap.files, f"no trace files appeared in {trace_dir}"
    assert any(f.endswith((".json", ".json.gz")) for f in cap.files), cap.files
    assert all(Path(f).stat().st_size > 0 for f in cap.files)
    assert json.loads(cap.to_row()["artifact"])["dir"] == str(trace_dir)

    # on demand from the command line: py-spy stacks, then the profiler, both stored
    db = tmp_path / "c.duckdb"
    res = subprocess.run([sys.executable, "-m", "vllm_sentinel", "capture", "--target", server.url, "--db", str(db),
                          "--vllm-profiler", "1s", "--format", "json"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)["profiler"]
    assert (doc["kind"], doc["status"], doc["artifact"]) == ("torch_profile", "ok", str(trace_dir)), doc
    assert doc["files"] and not set(doc["files"]) & set(cap.files), (doc["files"], cap.files)  # new traces only
    with Store.open(db, read_only=True) as s:
        kinds = s.con.execute("SELECT kind, status FROM captures ORDER BY ts").fetchall()
    assert ("torch_profile", "ok") in kinds and any(k == "dump" for k, _ in kinds), kinds
