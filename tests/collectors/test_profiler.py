"""collectors/profiler.py: argv parsing, the /start_profile -> /stop_profile flow, and nsys detection.

The HTTP answers below are what vLLM 0.32 gives (checked live in tests/integration/test_pyspy_live.py):
GET /start_profile is 405 where the profiler routes exist and 404 where they do not.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from vllm_sentinel.collectors import profiler as prof
from vllm_sentinel.collectors.process import VllmProcess


class RecordedServer:
    """Answers like a vLLM server started with or without --profiler-config; writes a trace on stop."""

    def __init__(self, routes: bool, trace_dir: Path | None = None, start_status: int = 200) -> None:
        self.routes = routes
        self.trace_dir = trace_dir
        self.start_status = start_status
        self.calls: list[tuple[str, str, bytes | None]] = []
        self.prefix: str | None = None

    def __call__(self, method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, str]:
        path = url.split("://", 1)[1].split("/", 1)[1]
        self.calls.append((method, "/" + path, body))
        if not self.routes:
            return 404, '{"detail":"Not Found"}'
        if method == "GET":
            return 405, '{"detail":"Method Not Allowed"}'
        if path == "start_profile":
            self.prefix = json.loads(body or b"{}").get("profile_prefix")
            return self.start_status, "" if self.start_status == 200 else '{"error": "already active"}'
        if self.trace_dir is not None:  # vLLM writes the traces when the profiler stops, named with the prefix
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            (self.trace_dir / f"{self.prefix}_rank0.1700000000000.pt.trace.json.gz").write_bytes(b"\x1f\x8b trace")
        return 200, ""


def _api(argv: list[str]) -> VllmProcess:
    return VllmProcess(pid=123, ppid=1, role="api_server", title="python", argv=argv)


def test_profiler_config_from_argv_json_and_dotted_forms():
    assert prof.profiler_config_from_argv(
        ["python", "-m", "vllm.entrypoints.openai.api_server", "--profiler-config",
         '{"profiler": "torch", "torch_profiler_dir": "/t"}']) == {"profiler": "torch", "torch_profiler_dir": "/t"}
    assert prof.profiler_config_from_argv(
        ["vllm", "serve", "m", "--profiler-config.profiler=torch", "--profiler-config.torch-profiler-dir", "/t"]
    ) == {"profiler": "torch", "torch_profiler_dir": "/t"}
    assert prof.profiler_config_from_argv(["--profiler-config", "{not json"]) == {}
    assert prof.profiler_config_from_argv(["--max-num-seqs", "4"]) == {}


def test_endpoints_detected_by_a_harmless_get():
    assert prof.endpoints_available("http://h:1", RecordedServer(routes=True)) is True
    assert prof.endpoints_available("http://h:1", RecordedServer(routes=False)) is False
    assert prof.endpoints_available("http://h:1", lambda *a: (0, "connection refused")) is None


def test_capture_is_off_by_default():
    server = RecordedServer(routes=True)
    cap = prof.VllmProfiler("http://h:1", "h:1", http=server).capture(1)
    assert cap.status == prof.STATUS_DISABLED and "slow serving" in cap.error
    assert server.calls == []  # nothing was sent


def test_capture_starts_waits_stops_and_lists_the_new_traces(tmp_path: Path):
    trace_dir = tmp_path / "traces"
    server = RecordedServer(routes=True, trace_dir=trace_dir)
    slept: list[float] = []
    api = _api(["python", "--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": str(trace_dir)})])
    trace_dir.mkdir()
    (trace_dir / "sentinel-0earlier_rank0.profiler_out.txt").write_text("vLLM rewrites a past capture's summary")
    cap = prof.VllmProfiler("http://h:1/", "h:1", enabled=True, http=server, api_server=api,
                            sleep=slept.append).capture(2.5, incident_id="inc-1")
    assert cap.status == prof.STATUS_OK, cap.error
    assert slept == [2.5]
    assert [(m, p) for m, p, _ in server.calls] == [("GET", "/start_profile"), ("POST", "/start_profile"),
                                                  ("POST", "/stop_profile")]
    assert json.loads(server.calls[1][2])["profile_prefix"].startswith("sentinel-")
    assert cap.artifact == str(trace_dir)
    assert cap.files == [str(trace_dir / f"{server.prefix}_rank0.1700000000000.pt.trace.json.gz")]
    row = cap.to_row()
    assert row["kind"] == "torch_profile" and row["incident_id"] == "inc-1" and row["pid"] == 123
    assert json.loads(row["artifact"]) == {"dir": str(trace_dir), "files": cap.files}
    assert "written to" in cap.to_event().message


def test_profiler_is_stopped_even_when_the_wait_is_interrupted():
    server = RecordedServer(routes=True)

    def interrupted(_s: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prof.VllmProfiler("http://h:1", "h:1", enabled=True, http=server, sleep=interrupted).capture(5)
    assert server.calls[-1][:2] == ("POST", "/stop_profile")


@pytest.mark.parametrize(("server", "status", "words"), [
    (RecordedServer(routes=False), prof.STATUS_UNSUPPORTED, "--profiler-config"),
    (RecordedServer(routes=True, start_status=400), prof.STATUS_FAILED, "/start_profile answered 400"),
    (lambda *a: (0, "connection refused"), prof.STATUS_UNREACHABLE, "did not answer"),
])
def test_capture_failures_are_statuses(server, status, words):
    cap = prof.VllmProfiler("http://h:1", "h:1", enabled=True, http=server, sleep=lambda s: None).capture(1)
    assert cap.status == status and words in cap.error
    assert "not taken" in cap.to_event().message


def _fake_proc(root: Path, pid: int, ppid: int, argv: list[str], maps: str = "") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    name = os.path.basename(argv[0])[:15]
    (d / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 1 0 1\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "comm").write_text(name + "\n")
    (d / "maps").write_text(maps)


def test_detects_a_server_under_nsys_launch(tmp_path: Path):
    _fake_proc(tmp_path, 10, 1, ["/opt/nsight/bin/nsys", "launch", "--session=vllm1", "-c", "cudaProfilerApi",
                                 "-o", "/out/run", "python", "-m", "vllm.entrypoints.openai.api_server"])
    _fake_proc(tmp_path, 11, 10, ["python", "-m", "vllm.entrypoints.openai.api_server"])
    procs = [VllmProcess(11, 10, "api_server", "python")]
    found = prof.detect_nsys(procs, tmp_path, which=lambda name: "/usr/local/bin/nsys")
    assert found.status == prof.STATUS_OK and found.under_nsys and found.launcher_pid == 10
    assert (found.session, found.output, found.cuda_profiler_api) == ("vllm1", "/out/run", True)
    # the launcher's nsys binary lives where the sidecar cannot run it
    missing = prof.detect_nsys(procs, tmp_path, which=lambda name: None)
    assert missing.status == prof.STATUS_NSYS_MISSING and missing.under_nsys
    assert "Nsight Systems" in missing.message


def test_detects_nsys_injection_library_in_maps(tmp_path: Path):
    _fake_proc(tmp_path, 20, 1, ["python", "-m", "vllm.entrypoints.openai.api_server"],
               maps="7f00-7f10 r-xp 0 08:01 5 /opt/nvidia/nsight-systems/target-linux-x64/libToolsInjection64.so\n")
    found = prof.detect_nsys([VllmProcess(20, 1, "api_server", "python")], tmp_path, which=lambda n: None)
    assert found.under_nsys and found.status == prof.STATUS_NSYS_MISSING


@pytest.mark.skipif(shutil.which("nsys") is not None, reason="nsys is installed here")
def test_nsys_absent_on_this_machine_is_a_status():
    me = VllmProcess(os.getpid(), os.getppid(), "api_server", "python")
    found = prof.detect_nsys([me])
    assert found.status == prof.STATUS_NSYS_MISSING and not found.under_nsys
    assert "not installed" in found.message
    assert prof.detect_nsys([]).status == prof.STATUS_NOT_UNDER_NSYS


def test_new_files_ignores_old_files_and_unreadable_dirs(tmp_path: Path):
    old = tmp_path / "old.json"
    old.write_text("{}")
    os.utime(old, (1_000, 1_000))
    fresh = tmp_path / "sub" / "new.json.gz"
    fresh.parent.mkdir()
    fresh.write_text("x")
    assert prof.new_files(str(tmp_path), 2_000) == [str(fresh)]
    assert prof.new_files(str(tmp_path / "absent"), 0) == []
    ours = tmp_path / "sub" / "sentinel-ab_rank0.pt.trace.json.gz"
    ours.write_text("x")
    assert prof.new_files(str(tmp_path), 2_000, "sentinel-ab") == [str(ours)]  # named with this capture's prefix
    assert prof.new_files(str(tmp_path), 2_000, "sentinel-cd") == [str(fresh), str(ours)]  # a vLLM that ignores it


def test_profile_capture_row_fits_the_captures_table(tmp_path: Path):
    import duckdb

    from vllm_sentinel.agent.store.migrations import CAPTURES_TABLE

    cap = prof.ProfileCapture("p1", 7, "h:1", "torch_profile", prof.STATUS_OK, artifact=str(tmp_path),
                              files=[str(tmp_path / "a.pt.trace.json.gz")])
    con = duckdb.connect(":memory:")
    con.execute(CAPTURES_TABLE)
    row = cap.to_row()
    con.execute(f"INSERT INTO captures ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    kind, artifact = con.execute("SELECT kind, artifact FROM captures").fetchone()
    assert kind == "torch_profile" and json.loads(artifact)["files"] == cap.files


CUDA_ARGV = ["python", "-m", "vllm.entrypoints.openai.api_server", "--profiler-config", '{"profiler": "cuda"}']


def test_cuda_profiler_under_nsys_drives_nsys_and_names_its_report(tmp_path: Path):
    _fake_proc(tmp_path, 10, 1, ["/opt/nsight/bin/nsys", "launch", "--session=vllm1", "-c", "cudaProfilerApi",
                                 "-o", "/out/run", *CUDA_ARGV])
    _fake_proc(tmp_path, 11, 10, CUDA_ARGV)
    server = RecordedServer(routes=True)
    api = VllmProcess(11, 10, "api_server", "python", argv=CUDA_ARGV)
    profiler = prof.VllmProfiler("http://h:1", "h:1", enabled=True, http=server, processes=[api], sleep=lambda s: None,
                                 detect=lambda procs: prof.detect_nsys(procs, tmp_path, which=lambda n: None))
    cap = profiler.capture(2, incident_id="inc1")
    assert cap.status == prof.STATUS_OK, cap.error
    assert (cap.kind, cap.artifact) == (prof.KIND_NSYS, "/out/run.nsys-rep")
    assert [c[:2] for c in server.calls[1:]] == [("POST", "/start_profile"), ("POST", "/stop_profile")]
    assert cap.to_row()["kind"] == "nsys" and "/out/run.nsys-rep" in cap.to_event().message


def test_nsys_report_without_output_flag_says_where_nsys_puts_it():
    assert prof.nsys_report(prof.NsysStatus(prof.STATUS_OK, "", under_nsys=True, output="/r/x.nsys-rep")) == "/r/x.nsys-rep"
    assert "session s1" in prof.nsys_report(prof.NsysStatus(prof.STATUS_OK, "", under_nsys=True, session="s1"))


@pytest.mark.parametrize(("nsys_on_path", "status"), [(None, prof.STATUS_NSYS_MISSING),
                                                       ("/usr/bin/nsys", prof.STATUS_NOT_UNDER_NSYS)])
def test_cuda_profiler_outside_nsys_is_refused_without_touching_the_server(tmp_path: Path, nsys_on_path, status):
    _fake_proc(tmp_path, 11, 1, CUDA_ARGV)
    server = RecordedServer(routes=True)
    api = VllmProcess(11, 1, "api_server", "python", argv=CUDA_ARGV)
    profiler = prof.VllmProfiler("http://h:1", "h:1", enabled=True, http=server, processes=[api], sleep=lambda s: None,
                                 detect=lambda procs: prof.detect_nsys(procs, tmp_path, which=lambda n: nsys_on_path))
    cap = profiler.capture(2)
    assert (cap.kind, cap.status) == (prof.KIND_NSYS, status)
    assert "nsys launch" in cap.error and '"cuda"' in cap.error
    assert not any(c[1] == "/start_profile" and c[0] == "POST" for c in server.calls)  # cudaProfilerStart alone records nothing
