"""collectors/process.py against real /proc: a listener with children titled as vLLM titles its processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vllm_sentinel.collectors.argv import parse_flags
from vllm_sentinel.collectors.process import (
    ProcessCollector,
    ProcessDiscoveryError,
    VllmProcess,
    client_connections,
    discover,
    listening_inodes,
    read_state,
    read_usage,
    role_from_title,
    target_port,
)
from vllm_sentinel.collectors.host_sockets import HostSockets, TcpTable, socket_inodes

# A stand-in for `vllm serve`: the parent listens (like the API server) and spawns an
# "EngineCore" that spawns a "Worker"; titles are set with setproctitle exactly as vLLM does.
_TREE = textwrap.dedent("""
    import os, socket, sys, time
    import setproctitle

    def child(title, then=None):
        pid = os.fork()
        if pid == 0:
            setproctitle.setproctitle(title)
            if then:
                then()
            time.sleep(60)
            os._exit(0)
        return pid

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    s.set_inheritable(False)
    engine = child("VLLM::EngineCore", lambda: (s.close(), child("VLLM::Worker_TP0")))
    print(s.getsockname()[1], flush=True)
    time.sleep(60)
""")


@pytest.fixture()
def fake_server():
    """A real process tree: listener (argv with vLLM flags) -> VLLM::EngineCore -> VLLM::Worker_TP0."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _TREE, "--max-num-seqs", "8", "--max-model-len=512", "--enforce-eager"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(proc.stdout.readline())
        _wait_for(lambda: len(_titled_children(proc.pid)) == 2)
        yield proc, port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _titled_children(root: int) -> list[int]:
    """Pids in root's process group whose cmdline starts with VLLM::."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getpgid(int(name)) == root and Path(f"/proc/{name}/cmdline").read_bytes().startswith(b"VLLM::"):
                found.append(int(name))
        except OSError:
            continue
    return found


def _wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_discover_finds_listener_engine_and_worker_with_roles(fake_server):
    proc, port = fake_server
    found = discover(f"http://127.0.0.1:{port}/metrics")
    assert [p.role for p in found] == ["api_server", "engine_core", "worker"]
    api, engine, worker = found
    assert api.pid == proc.pid
    assert engine.ppid == proc.pid and worker.ppid == engine.pid
    assert engine.title == "VLLM::EngineCore" and worker.title == "VLLM::Worker_TP0"
    # the lead reads engine flags from the API server's command line
    assert api.flags()["--max-num-seqs"] == "8"
    assert api.flags()["--max-model-len"] == "512"
    assert api.flags()["--enforce-eager"] == "true"


def test_collector_emits_cpu_and_memory_series_per_process(fake_server):
    proc, port = fake_server
    collector = ProcessCollector(f"127.0.0.1:{port}")
    batch = collector.collect(1_000)
    assert batch.status is not None and batch.status.ok, batch.status
    assert batch.instance == f"127.0.0.1:{port}"
    rows = {(m, lab) for m, lab in zip(batch.metrics, batch.labels)}
    for role in ("api_server", "engine_core", "worker"):
        pid = next(p.pid for p in collector.processes if p.role == role)
        labels = f'pid="{pid}",role="{role}"'
        for metric in ("vllm_sentinel_process_cpu_seconds_total", "vllm_sentinel_process_resident_memory_bytes",
                       "vllm_sentinel_process_threads", "vllm_sentinel_process_start_time_seconds"):
            assert (metric, labels) in rows
    rss = [v for m, v in zip(batch.metrics, batch.values) if m.endswith("resident_memory_bytes")]
    assert all(v > 1_000_000 for v in rss)  # a Python interpreter holds megabytes
    start = [v for m, v in zip(batch.metrics, batch.values) if m.endswith("start_time_seconds")]
    assert all(abs(v - time.time()) < 600 for v in start)
    assert batch.events == []  # first discovery is not a change


def test_collector_reports_a_process_that_exited(fake_server):
    proc, port = fake_server
    collector = ProcessCollector(f"127.0.0.1:{port}")
    collector.collect(1_000)
    worker = next(p for p in collector.processes if p.role == "worker")
    os.kill(worker.pid, signal.SIGKILL)
    _wait_for(lambda: not any(p.role == "worker" for p in discover(f"127.0.0.1:{port}")))
    batch = collector.collect(2_000)
    assert [(e.kind, e.labels["role"], e.labels["pid"]) for e in batch.events] == [
        ("process_exited", "worker", str(worker.pid))]
    assert {p.role for p in collector.processes} == {"api_server", "engine_core"}


def _values(batch, metric: str) -> dict[str, float]:
    return {lab: v for m, lab, v in zip(batch.metrics, batch.labels, batch.values) if m == metric}


def test_collector_sees_a_stopped_engine_core_and_client_connections(fake_server):
    proc, port = fake_server
    collector = ProcessCollector(f"127.0.0.1:{port}")
    collector.collect(1_000)
    engine = next(p for p in collector.processes if p.role == "engine_core")
    labels = f'pid="{engine.pid}",role="engine_core"'
    # two clients of another process connect (the listener never accepts: the kernel completes the handshake)
    clients = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import socket, sys, time
        a = socket.create_connection(("127.0.0.1", {port})); b = socket.create_connection(("127.0.0.1", {port}))
        print("ok", flush=True); time.sleep(30)""")], stdout=subprocess.PIPE, text=True)
    own = socket.create_connection(("127.0.0.1", port))  # this process stands for the sidecar's own scrape
    try:
        assert clients.stdout is not None and clients.stdout.readline().strip() == "ok"
        os.kill(engine.pid, signal.SIGSTOP)
        _wait_for(lambda: read_state(engine.pid) == "T")
        batch = collector.collect(2_000)
        assert _values(batch, "vllm_sentinel_process_stopped")[labels] == 1.0
        assert _values(batch, "vllm_sentinel_server_client_connections") == {"": 2.0}
        assert client_connections(port) == 3  # with the own connection counted
        assert client_connections(port, socket_inodes(os.getpid())) == 2
    finally:
        os.kill(engine.pid, signal.SIGCONT)
        own.close()
        clients.kill()
        clients.wait()
    _wait_for(lambda: read_state(engine.pid) != "T")
    _wait_for(lambda: client_connections(port) == 0)
    batch = collector.collect(3_000)
    assert _values(batch, "vllm_sentinel_process_stopped")[labels] == 0.0
    assert _values(batch, "vllm_sentinel_server_client_connections") == {"": 0.0}


def test_client_connections_from_an_injected_proc_root(tmp_path):
    # server [::]:8000 (dual stack) with two IPv4 clients seen as ::ffff:127.0.0.1; the client ends are rows
    # of /proc/net/tcp; the one on port 0xC351 (50001) is held by pid 9 (the sidecar): not counted
    net = tmp_path / "net"
    net.mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (net / "tcp").write_text(head +
        "   0: 0100007F:C350 0100007F:1F40 01 00000000:00000000 00:00000000 00000000  0  0 801 1\n"
        "   1: 0100007F:C351 0100007F:1F40 01 00000000:00000000 00:00000000 00000000  0  0 802 1\n")
    mapped = "0000000000000000FFFF00000100007F"
    (net / "tcp6").write_text(head +
        f"   0: 00000000000000000000000000000000:1F40 {'0' * 32}:0000 0A 00000000:00000000 00:00000000 0 0 0 700 1\n"
        f"   1: {mapped}:1F40 {mapped}:C350 01 00000000:00000000 00:00000000 0 0 0 701 1\n"
        f"   2: {mapped}:1F40 {mapped}:C351 01 00000000:00000000 00:00000000 0 0 0 702 1\n")
    (tmp_path / "9" / "fd").mkdir(parents=True)
    os.symlink("socket:[802]", tmp_path / "9" / "fd" / "3")
    os.symlink("/dev/null", tmp_path / "9" / "fd" / "4")
    assert socket_inodes(9, tmp_path) == {802}
    assert client_connections(8000, set(), tmp_path) == 2
    assert client_connections(8000, socket_inodes(9, tmp_path), tmp_path) == 1
    assert client_connections(8001, set(), tmp_path) == 0


def test_cpu_counter_grows_with_work():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"])
    try:
        first = read_usage(busy.pid)
        time.sleep(0.5)
        second = read_usage(busy.pid)
        assert first is not None and second is not None
        assert second.cpu_seconds > first.cpu_seconds
    finally:
        busy.kill()
        busy.wait()
    assert read_usage(busy.pid) is None  # reaped: gone, not an exception


def test_nothing_listening_is_a_status_naming_the_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening
    with pytest.raises(ProcessDiscoveryError, match=f"nothing listens on TCP port {port}"):
        discover(f"127.0.0.1:{port}")
    batch = ProcessCollector(f"http://127.0.0.1:{port}").collect(5)
    assert batch.status is not None and not batch.status.ok
    assert "same Kubernetes pod" in (batch.status.error or "")
    assert len(batch) == 0


def test_listening_socket_read_from_an_injected_proc_root(tmp_path):
    # /proc/net/tcp6 line of a server on [::]:8000 (0x1F40), inode 4242; a connected socket is ignored
    net = tmp_path / "net"
    net.mkdir()
    (net / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 777 1\n")
    (net / "tcp6").write_text(
        "  sl  local_address                         remote_address                        st tx_queue rx_queue "
        "tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n")
    assert listening_inodes(8000, tmp_path) == {4242}
    assert listening_inodes(8001, tmp_path) == set()
    pid_dir = tmp_path / "321"
    (pid_dir / "fd").mkdir(parents=True)
    os.symlink("socket:[4242]", pid_dir / "fd" / "5")
    (pid_dir / "stat").write_text("321 (python (x)) S 1 321 321 0 -1 0 0 0 0 0 150 50 0 0 20 0 7 0 100 0 2000\n")
    (pid_dir / "statm").write_text("1000 300 0 0 0 0 0\n")
    (pid_dir / "cmdline").write_bytes(b"python\0-m\0vllm.entrypoints.openai.api_server\0--port\x008000\0")
    (pid_dir / "comm").write_text("python\n")
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    found = discover("127.0.0.1:8000", tmp_path)
    assert [(p.pid, p.role) for p in found] == [(321, "api_server")]
    usage = read_usage(321, tmp_path)
    assert usage is not None
    assert usage.cpu_seconds == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))
    assert usage.rss_bytes == 300 * os.sysconf("SC_PAGE_SIZE")
    assert usage.threads == 7
    assert usage.start_time_s == pytest.approx(1_700_000_000 + 100 / os.sysconf("SC_CLK_TCK"))


@pytest.mark.parametrize(("title", "role"), [
    ("VLLM::EngineCore", "engine_core"), ("VLLM::EngineCor", "engine_core"),  # comm cuts at 15 chars
    ("VLLM::EngineCore_DP1", "engine_core"), ("VLLM::Worker", "worker"), ("VLLM::Worker_TP1_PP0", "worker"),
    ("VLLM::APIServer_0", "api_server"), ("VLLM::DPCoordinator", "dp_coordinator"),
    ("MYPREFIX::Worker_TP0", "worker"), ("python", None), ("/usr/bin/python3", None),
])
def test_role_from_title(title, role):
    assert role_from_title(title) == role


def test_parse_flags_and_target_port():
    argv = ["vllm", "serve", "/models/x", "--max-num-seqs", "256", "--enable-prefix-caching",
            "--max-model-len=4096", "--tensor-parallel-size", "2"]
    assert parse_flags(argv) == {"--max-num-seqs": "256", "--enable-prefix-caching": "",
                                 "--max-model-len": "4096", "--tensor-parallel-size": "2"}
    # a process's flags are read as vLLM reads them: a known switch never swallows the model after it
    proc = VllmProcess(1, 0, "api_server", "VLLM::APIServer", ["vllm", "serve", "--enforce-eager", "/models/x", "-tp", "2"])
    assert proc.flags() == {"--enforce-eager": "true", "--model": "/models/x", "--tensor-parallel-size": "2"}
    assert target_port("http://10.0.0.1:8000/metrics") == 8000
    assert target_port("127.0.0.1:9000") == 9000
    assert target_port("http://example") == 80


def test_parse_flags_switches_no_flags_and_short_names():
    argv = ["nsys", "launch", "--session=s1", "-o", "/t/out", "--trace", "cuda,nvtx", "--wait"]
    assert parse_flags(argv) == {"--session": "s1", "--trace": "cuda,nvtx", "--wait": ""}
    # an unknown flag followed by another flag is a switch, not the other flag's name as its value
    assert parse_flags(["--disable-foo", "--port", "9"]) == {"--disable-foo": "", "--port": "9"}
    assert parse_flags(["--no-x", "-tp", "4"], switches={"--x"}, short={"-tp": "--tensor-parallel-size"}) == {
        "--x": "false", "--tensor-parallel-size": "4"}


_LATE_CHILD = textwrap.dedent("""
    import os, signal, socket, time
    import setproctitle

    def spawn(*_):
        if os.fork() == 0:
            setproctitle.setproctitle("VLLM::EngineCore")
            time.sleep(60)
            os._exit(0)

    signal.signal(signal.SIGUSR1, spawn)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    print(s.getsockname()[1], flush=True)
    time.sleep(60)
""")


def test_discovery_is_kept_until_a_process_changes_or_it_is_old():
    server = subprocess.Popen([sys.executable, "-c", _LATE_CHILD], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        port = int(server.stdout.readline())
        collector = ProcessCollector(f"127.0.0.1:{port}", rediscover_s=30)
        collector.collect(1_000)
        assert [p.role for p in collector.processes] == ["api_server"]
        server.send_signal(signal.SIGUSR1)  # an engine core starts after the first discovery
        _wait_for(lambda: len(_titled_children(server.pid)) == 1)
        # everything found is alive and younger than 30 s: kept, no /proc scan, so not seen yet
        collector.collect(30_999)
        assert [p.role for p in collector.processes] == ["api_server"]
        collector.collect(31_000)
        assert [p.role for p in collector.processes] == ["api_server", "engine_core"]
        events = collector.collect(32_000).events
        assert events == []  # and kept again
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_a_restarted_process_is_found_again_at_once(fake_server):
    proc, port = fake_server
    collector = ProcessCollector(f"127.0.0.1:{port}", rediscover_s=3600)
    collector.collect(1_000)
    worker = next(p for p in collector.processes if p.role == "worker")
    os.kill(worker.pid, signal.SIGKILL)  # a zombie until its parent reaps it: gone all the same
    _wait_for(lambda: read_usage(worker.pid) is None or
              Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    batch = collector.collect(2_000)
    assert [(e.kind, e.labels["pid"]) for e in batch.events] == [("process_exited", str(worker.pid))]
