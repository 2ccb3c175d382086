"""collectors/pyspy.py: real py-spy against real processes, and parsing of real vLLM captures (fixtures/pyspy)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from vllm_sentinel.agent.store.migrations import CAPTURES_TABLE
from vllm_sentinel.collectors import pyspy as ps
from vllm_sentinel.collectors.frames import split_stack
from vllm_sentinel.collectors.process import VllmProcess

FIXTURES = Path(__file__).parent / "fixtures" / "pyspy"
PY_SPY = ps.find_py_spy()
needs_pyspy = pytest.mark.skipif(PY_SPY is None, reason="py-spy not installed (pip install py-spy)")

_SPINNER = textwrap.dedent("""
    import threading, time
    def spin_forever():
        x = 0
        while True:
            x += 1
    def nap_forever():
        while True:
            time.sleep(30)  # one long sleep: a thread that wakes often can be caught runnable, waiting for the GIL
    threading.Thread(target=spin_forever, name="spinner", daemon=True).start()
    threading.Thread(target=nap_forever, name="napper", daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.fixture()
def spinner():
    """A Python process with one busy and one sleeping thread."""
    proc = subprocess.Popen([sys.executable, "-c", _SPINNER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@needs_pyspy
def test_dump_of_a_live_process_lists_its_threads(spinner):
    cap = ps.PySpy().dump(spinner.pid, "api_server", "127.0.0.1:8000")
    assert cap.status == ps.STATUS_OK, cap.error
    assert cap.process_state in ("R", "S")
    names = {t.name: t for t in cap.threads}
    assert {"MainThread", "spinner", "napper"} <= set(names)
    assert any("spin_forever" in f for f in names["spinner"].frames)
    assert not names["napper"].active
    # folded form: one sample per thread, thread label first, frames root first, py-spy's activity
    napper = next(s for s in cap.stacks if ": napper [idle]" in s)
    assert napper.split(";")[-1].startswith("nap_forever ")


@needs_pyspy
def test_record_samples_running_threads_by_default(spinner):
    cap = ps.PySpy(rate=50).record(spinner.pid, "worker", "i:1", duration_s=1)
    assert cap.status == ps.STATUS_OK, cap.error
    assert cap.samples >= 10
    spinning = sum(n for s, n in cap.stacks.items() if ": spinner;" in s)
    assert spinning >= 0.8 * cap.samples  # sleeping threads are not sampled (the napper wakes now and then)
    assert not cap.idle_included
    with_idle = ps.PySpy(rate=50).record(spinner.pid, "worker", "i:1", duration_s=1, idle=True)
    assert any("napper" in s for s in with_idle.stacks)


@needs_pyspy
def test_exited_process_is_a_status():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for cap in (ps.PySpy().dump(gone.pid, "worker", "i:1"),
                ps.PySpy().record(gone.pid, "worker", "i:1", duration_s=1)):
        assert cap.status == ps.STATUS_EXITED, (cap.status, cap.error)
        assert f"process {gone.pid} exited" in (cap.error or "")
        assert cap.samples == 0


@needs_pyspy
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_missing_ptrace_permission_names_the_fix(spinner):
    # py-spy as user nobody against our process: the kernel refuses (EPERM), as in a container without SYS_PTRACE
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PY_SPY]
    cap = ps.PySpy(py_spy=as_nobody).dump(spinner.pid, "engine_core", "i:1")
    assert cap.status == ps.STATUS_PERMISSION, (cap.status, cap.error)
    assert "SYS_PTRACE" in cap.error and "root" in cap.error


def test_missing_py_spy_is_a_status(spinner):
    spy = ps.PySpy(py_spy=["/nonexistent/py-spy"])
    cap = spy.dump(spinner.pid, "worker", "i:1")
    assert cap.status == ps.STATUS_MISSING
    assert "pip install py-spy" in cap.error
    none = ps.PySpy(py_spy="/nonexistent/py-spy")
    assert none.record(spinner.pid, "worker", "i:1").status == ps.STATUS_MISSING


@needs_pyspy
def test_a_non_python_process_is_a_status():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        cap = ps.PySpy().dump(sleeper.pid, "worker", "i:1")
        assert cap.status == ps.STATUS_NOT_PYTHON, (cap.status, cap.error)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_run_bounded_caps_output_and_time():
    big = ps.run_bounded([sys.executable, "-c", "print('x' * 100000)"], 30, 1000)
    assert big.returncode == 0 and big.truncated and len(big.stdout) == 1000
    slow = ps.run_bounded([sys.executable, "-c", "import time; time.sleep(30)"], 0.3, 1000)
    assert slow.timed_out and slow.returncode != 0
    missing = ps.run_bounded(["/nonexistent/tool"], 1, 10)
    assert missing.missing


def test_timeout_becomes_a_status(spinner):
    def slow(argv, timeout, max_bytes):  # what run_bounded returns when py-spy hangs
        return ps.RunResult(-9, b"", "", timed_out=True)
    cap = ps.PySpy(py_spy=["py-spy"], run=slow).dump(spinner.pid, "worker", "i:1")
    assert cap.status == ps.STATUS_TIMEOUT and "timeout" in cap.error


def test_rate_limiter_per_target_and_per_incident():
    now = [1000.0]
    lim = ps.RateLimiter(per_target_s=30, per_incident=2, clock=lambda: now[0])
    assert lim.check("a", "inc1") is None
    lim.take("a", "inc1")
    assert "next capture allowed in 30 s" in lim.check("a", "inc1")
    assert lim.check("b", None) is None  # other targets are independent
    now[0] += 30
    assert lim.check("a", "inc1") is None
    lim.take("a", "inc1")
    now[0] += 31
    assert "already has 2 captures" in lim.check("a", "inc1")
    assert lim.check("a", "inc2") is None
    assert lim.check("a", None) is None


def test_rate_limiter_keeps_each_incident_kind_its_own_slot():
    """A queue_blocking capture does not take the slot of an engine_stall 20 s later (its stacks exist only then)."""
    now = [1000.0]
    lim = ps.RateLimiter(per_target_s=30, clock=lambda: now[0])
    lim.take("a", "q1", "queue_blocking")
    now[0] += 20
    assert lim.check("a", "s1", "engine_stall") is None
    assert "captured for queue_blocking 20 s ago" in lim.check("a", "q2", "queue_blocking")


@needs_pyspy
def test_capture_target_runs_all_processes_and_rate_limits(spinner):
    procs = [VllmProcess(spinner.pid, 1, "api_server", "python"), VllmProcess(spinner.pid, 1, "worker", "x")]
    lim = ps.RateLimiter(per_target_s=30)
    tc = ps.capture_target("127.0.0.1:1", ps.PySpy(), procs, instance="127.0.0.1:1", limiter=lim,
                           incident_id="inc-7")
    assert tc.status == ps.STATUS_OK
    assert [c.role for c in tc.captures] == ["api_server", "worker"]
    assert all(c.incident_id == "inc-7" and c.ok for c in tc.captures)
    events = tc.events()
    assert [e.kind for e in events] == ["pyspy_capture"] * 2 and events[0].labels["incident_id"] == "inc-7"
    again = ps.capture_target("127.0.0.1:1", ps.PySpy(), procs, instance="127.0.0.1:1", limiter=lim)
    assert again.status == ps.STATUS_RATE_LIMITED and again.captures == []
    assert ps.capture_target("t", ps.PySpy(), [], instance="t").status == ps.STATUS_NO_PROCESSES


def test_real_vllm_dump_fixtures_parse():
    threads = ps.parse_dump_json((FIXTURES / "load-dump-engine_core.json").read_bytes())
    main = next(t for t in threads if t.name == "MainThread")
    assert main.frames[0].startswith("<module> ")  # root first
    assert any(f.startswith("EngineCore.step (vllm/v1/engine/core.py:") for f in main.frames)
    assert {t.name for t in threads} >= {"MainThread", "MultiprocWorkerMonitor"}
    stacks = ps.dump_to_folded(threads)
    assert sum(stacks.values()) == len(threads)


def test_real_vllm_record_fixture_parses_to_folded_stacks():
    text = (FIXTURES / "load-record-worker.txt").read_text()
    stacks = ps.parse_folded(text)
    assert sum(stacks.values()) == sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines())
    assert any("LlamaModel.forward (vllm/model_executor/models/llama.py:" in s for s in stacks)
    thread, frames = split_stack(next(iter(stacks)))
    assert thread is not None and thread.startswith("thread (") and frames


def test_capture_row_fits_the_proposed_table():
    cap = ps.Capture(capture_id="c1", ts_ms=5, instance="i:1", pid=9, role="worker", kind="record",
                     status="ok", stacks={"thread (9): MainThread;a (x.py:1)": 3, "b (y.py:2)": 1},
                     incident_id="inc", process_state="R")
    con = duckdb.connect(":memory:")
    con.execute(CAPTURES_TABLE)
    row = cap.to_row()
    con.execute(f"INSERT INTO captures ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    folded, samples = con.execute("SELECT folded, samples FROM captures").fetchone()
    assert samples == 4
    assert ps.parse_folded(folded) == cap.stacks
    assert folded.splitlines()[0] == "thread (9): MainThread;a (x.py:1) 3"  # most samples first


def test_a_torn_nonblocking_dump_is_retried(spinner):
    real = (FIXTURES / "load-dump-worker.json").read_bytes()
    answers = [ps.RunResult(1, b"", "Error: Failed to copy PyCodeObject"), ps.RunResult(0, real, "")]
    cap = ps.PySpy(py_spy=["py-spy"], run=lambda *a: answers.pop(0)).dump(spinner.pid, "worker", "i:1")
    assert cap.ok and cap.samples == 4
    always = ps.PySpy(py_spy=["py-spy"], dump_retries=1,
                      run=lambda *a: ps.RunResult(1, b"", "Error: Failed to copy PyCodeObject"))
    failed = always.dump(spinner.pid, "worker", "i:1")
    assert failed.status == ps.STATUS_FAILED
    assert "Failed to copy PyCodeObject" in failed.error and "after 2 attempts" in failed.error


@needs_pyspy
def test_record_of_an_idle_process_is_ok_with_no_samples():
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('r', flush=True); time.sleep(30)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        idle.stdout.readline()
        cap = ps.PySpy().record(idle.pid, "api_server", "i:1", duration_s=1)
        assert cap.ok and cap.samples == 0, (cap.status, cap.error)
        assert "idle or blocked" in cap.error
        assert ps.PySpy().record(idle.pid, "api_server", "i:1", duration_s=1, idle=True).samples > 0
    finally:
        idle.kill()
        idle.wait()


@needs_pyspy
def test_capture_now_discovers_the_listener_and_dumps_it():
    code = ("import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(30)")
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        tc = ps.capture_now(f"http://127.0.0.1:{port}")
        assert tc.status == ps.STATUS_OK and tc.instance == f"127.0.0.1:{port}"
        assert [(c.pid, c.role) for c in tc.captures] == [(server.pid, "api_server")]
        assert any("<module>" in s for s in tc.captures[0].stacks)
    finally:
        server.kill()
        server.wait()
    gone = ps.capture_now(f"127.0.0.1:{port}")
    assert gone.status == ps.STATUS_NO_PROCESSES and "nothing listens" in gone.error
    assert gone.events()[0].labels["status"] == ps.STATUS_NO_PROCESSES
