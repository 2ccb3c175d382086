"""vLLM's own profiler (/start_profile, /stop_profile) and Nsight Systems: detect, trigger a short capture, say where it went.

vLLM 0.32 serves the two endpoints only when started with a profiler config, e.g.
`--profiler-config '{"profiler": "torch", "torch_profiler_dir": "/traces"}'` (or the dotted form
`--profiler-config.profiler=torch --profiler-config.torch_profiler_dir=/traces`); traces are then
written by every worker (and the API server) into that directory when /stop_profile arrives.
With `"profiler": "cuda"` the same endpoints call cudaProfilerStart/Stop, which drive Nsight Systems
when the server runs under `nsys launch --capture-range=cudaProfilerApi`.

Profiling slows serving, so `VllmProfiler` is off unless constructed with `enabled=True`. With
`"profiler": "cuda"` it triggers only when the server really runs under nsys; otherwise it says why.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .base import Event, now_ms
from .argv import parse_flags
from .process import VllmProcess, parent_map, read_title

STATUS_OK = "ok"
STATUS_DISABLED = "disabled"
STATUS_UNSUPPORTED = "unsupported"  # the server has no profiler endpoints
STATUS_UNREACHABLE = "unreachable"
STATUS_FAILED = "failed"
STATUS_NSYS_MISSING = "nsys_missing"
STATUS_NOT_UNDER_NSYS = "not_under_nsys"

KIND_TORCH = "torch_profile"
KIND_NSYS = "nsys"
PROFILER_KINDS = (KIND_TORCH, KIND_NSYS)  # captures-table kinds written by this module (py-spy's are dump/record)

ENABLE_HINT = ("start vLLM with --profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": "
               "\"/path/to/traces\"}' to expose /start_profile and /stop_profile")
NSYS_LAUNCH_HINT = ("run vLLM under `nsys launch --trace=cuda,nvtx --capture-range=cudaProfilerApi` with "
                    "--profiler-config '{\"profiler\": \"cuda\"}'")
NSYS_MISSING_HINT = ("nsys (NVIDIA Nsight Systems) is not installed or not on PATH: install Nsight Systems "
                     "and " + NSYS_LAUNCH_HINT)

# (status, body text) of one HTTP request; injectable so tests hand in a recording or a local server
Http = Callable[[str, str, bytes | None, float], tuple[int, str]]


def http_request(method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, str]:
    """One HTTP request: (status, body); status 0 and the error text when nothing answered."""
    req = urllib.request.Request(url, data=body, method=method,  # noqa: S310 - the operator's target URL
                                 headers={"Content-Type": "application/json"} if body is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return resp.status, resp.read(64 * 1024).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(64 * 1024).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def profiler_config_from_argv(argv: list[str]) -> dict[str, object]:
    """vLLM's --profiler-config from a command line, JSON or dotted form; {} when absent.

    ['--profiler-config', '{"profiler": "torch", "torch_profiler_dir": "/t"}'] -> {'profiler': 'torch', 'torch_profiler_dir': '/t'}
    ['--profiler-config.profiler=torch', '--profiler-config.torch_profiler_dir', '/t'] -> the same
    """
    config: dict[str, object] = {}
    for key, value in parse_flags(argv).items():
        if key == "--profiler-config":
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                config.update(parsed)
        elif key.startswith("--profiler-config."):
            config[key.split(".", 1)[1].replace("-", "_")] = value
    return config


def endpoints_available(base_url: str, http: Http = http_request, timeout_s: float = 5.0) -> bool | None:
    """True if the server routes /start_profile, False if not, None if it did not answer.

    A GET (harmless: the routes accept POST only) answers 405 where the route exists and 404 where not.
    """
    status, _ = http("GET", base_url.rstrip("/") + "/start_profile", None, timeout_s)
    if status == 0:
        return None
    return status == 405


@dataclass
class ProfileCapture:
    """One profiler run: where its output went (`artifact`) and which files appeared, or why none ran."""

    capture_id: str
    ts_ms: int
    instance: str
    kind: str  # torch_profile | nsys
    status: str
    error: str | None = None
    incident_id: str | None = None
    pid: int = 0
    duration_ms: int = 0
    artifact: str | None = None  # the trace directory (or nsys report) the server writes to
    files: list[str] = field(default_factory=list)  # trace files seen there, when the sidecar can read it

    @property
    def ok(self) -> bool:
        """True when the capture ran."""
        return self.status == STATUS_OK

    def to_row(self) -> dict[str, object]:
        """The row for the store's `captures` table (agent/store/migrations.py's CAPTURES_TABLE)."""
        artifact = self.artifact
        if self.files:
            artifact = json.dumps({"dir": self.artifact, "files": self.files})
        return {
            "capture_id": self.capture_id, "ts": self.ts_ms, "instance": self.instance,
            "incident_id": self.incident_id, "pid": self.pid, "role": "api_server", "kind": self.kind,
            "status": self.status, "error": self.error, "duration_ms": self.duration_ms, "samples": None,
            "folded": None, "idle_included": None, "process_state": None, "artifact": artifact,
        }

    def to_event(self) -> Event:
        """A timeline event naming where the trace went."""
        labels = {"capture_id": self.capture_id, "kind": self.kind, "status": self.status}
        if self.incident_id:
            labels["incident_id"] = self.incident_id
        message = (f"{self.kind} capture written to {self.artifact}" + (f" ({len(self.files)} files)" if self.files else "")
                   if self.ok else f"{self.kind} capture not taken: {self.error}")
        return Event(self.ts_ms, self.instance, "profiler_capture", labels, message)


class VllmProfiler:
    """Triggers vLLM's /start_profile, waits, /stop_profile; off by default (it slows serving).

    The server's --profiler-config decides what records: "torch" writes traces to its
    torch_profiler_dir; "cuda" calls cudaProfilerStart/Stop, which only Nsight Systems records, so
    the trigger is sent only when the server runs under nsys (`detect_nsys`)."""

    def __init__(self, base_url: str, instance: str, *, enabled: bool = False, http: Http = http_request,
                 api_server: VllmProcess | None = None, processes: list[VllmProcess] | None = None,
                 detect: Callable[[list[VllmProcess]], NsysStatus] | None = None, stop_timeout_s: float = 300.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.base_url = base_url.rstrip("/")
        self.instance = instance
        self.enabled = enabled
        self.http = http
        processes = list(processes or [])
        self.api_server = api_server or next((p for p in processes if p.role == "api_server"), None)
        self.processes = processes or ([self.api_server] if self.api_server else [])
        self.detect = detect or detect_nsys
        self.stop_timeout_s = stop_timeout_s
        self.sleep = sleep

    def profiler_kind(self) -> str:
        """The server's configured profiler ("torch", "cuda"; "torch" when not known)."""
        if self.api_server is None:
            return "torch"
        return str(profiler_config_from_argv(self.api_server.argv).get("profiler") or "torch")

    def trace_dir(self) -> str | None:
        """The server's torch_profiler_dir, read from its command line (None when not known)."""
        if self.api_server is None:
            return None
        value = profiler_config_from_argv(self.api_server.argv).get("torch_profiler_dir")
        return str(value) if value else None

    def capture(self, duration_s: float = 3.0, incident_id: str | None = None) -> ProfileCapture:
        """Profile for `duration_s` seconds; the result names the trace directory and new files in it."""
        cap = ProfileCapture(uuid.uuid4().hex[:16], now_ms(), self.instance, KIND_TORCH, STATUS_OK,
                             incident_id=incident_id, pid=self.api_server.pid if self.api_server else 0)
        if not self.enabled:
            cap.status, cap.error = STATUS_DISABLED, ("vLLM profiler captures are off (they slow serving); "
                                                     "enable them in the sidecar's configuration")
            return cap
        available = endpoints_available(self.base_url, self.http)
        if available is None:
            cap.status, cap.error = STATUS_UNREACHABLE, f"{self.base_url} did not answer"
            return cap
        if not available:
            cap.status, cap.error = STATUS_UNSUPPORTED, f"{self.base_url} has no /start_profile: {ENABLE_HINT}"
            return cap
        if self.profiler_kind() == "cuda":
            cap.kind = KIND_NSYS
            nsys = self.detect(self.processes)
            if not nsys.under_nsys:
                # cudaProfilerStart outside nsys records nothing: sending it would only cost the server
                cap.status = STATUS_NSYS_MISSING if nsys.status == STATUS_NSYS_MISSING else STATUS_NOT_UNDER_NSYS
                cap.error = ("the server's profiler is \"cuda\", which only Nsight Systems records, and "
                             f"{nsys.message[0].lower() + nsys.message[1:]}"
                             + ("" if nsys.status == STATUS_NSYS_MISSING else f"; {NSYS_LAUNCH_HINT}"))
                return cap
            cap.artifact = nsys_report(nsys)
        else:
            cap.artifact = self.trace_dir()
        t0 = time.monotonic()
        started_wall = time.time()
        prefix = f"sentinel-{cap.capture_id}"
        body = json.dumps({"profile_prefix": prefix}).encode()
        status, text = self.http("POST", self.base_url + "/start_profile", body, 60.0)
        if status != 200:
            cap.status, cap.error = STATUS_FAILED, f"/start_profile answered {status}: {text[:300]}"
            return cap
        try:
            self.sleep(duration_s)
        finally:
            # always stop: a profiler left running slows serving until someone notices
            status, text = self.http("POST", self.base_url + "/stop_profile", None, self.stop_timeout_s)
        cap.duration_ms = int((time.monotonic() - t0) * 1000)
        if status != 200:
            cap.status, cap.error = STATUS_FAILED, f"/stop_profile answered {status}: {text[:300]}"
            return cap
        if cap.artifact and cap.kind == KIND_TORCH:
            cap.files = new_files(cap.artifact, started_wall, prefix)
        return cap


def new_files(directory: str, since_s: float, prefix: str | None = None) -> list[str]:
    """Files under `directory` modified at or after `since_s` (sorted; [] if unreadable, e.g. another container).

    With `prefix` (the profile_prefix sent to /start_profile), only the files named with it, when any
    are: vLLM still touches an earlier capture's files after it, so their times alone mix captures up.
    """
    found = []
    try:
        for root, _dirs, names in os.walk(directory):
            for name in names:
                path = os.path.join(root, name)
                try:
                    if os.path.getmtime(path) >= since_s - 1:
                        found.append(path)
                except OSError:
                    continue
    except OSError:
        return []
    ours = [f for f in found if prefix and os.path.basename(f).startswith(prefix)]
    return sorted(ours or found)


@dataclass
class NsysStatus:
    """Whether the server runs under Nsight Systems, whether nsys is here, and how to drive it."""

    status: str  # ok | not_under_nsys | nsys_missing
    message: str
    nsys_path: str | None = None  # nsys on this host, if any
    under_nsys: bool = False
    # the `nsys launch` that runs the server: its pid, session and report file
    launcher_pid: int | None = None
    session: str | None = None
    output: str | None = None
    cuda_profiler_api: bool = False  # nsys waits for cudaProfilerStart: /start_profile with profiler=cuda drives it


def detect_nsys(processes: list[VllmProcess], proc_root: str | Path = "/proc",
                which: Callable[[str], str | None] = shutil.which) -> NsysStatus:
    """Look for `nsys launch|profile` among the API server's ancestors, or Nsight's injection library in its maps."""
    nsys_here = which("nsys")
    api = next((p for p in processes if p.role == "api_server"), None)
    if api is None:
        return NsysStatus(STATUS_NOT_UNDER_NSYS, "no vLLM API server process found", nsys_path=nsys_here)
    parents = parent_map(proc_root)
    pid: int | None = parents.get(api.pid)
    while pid and pid > 1:
        _title, argv = read_title(pid, proc_root)
        if argv and os.path.basename(argv[0]) == "nsys" and {"launch", "profile"} & set(argv[1:3]):
            flags = parse_flags(argv)
            path = nsys_here or (argv[0] if os.path.exists(argv[0]) else None)
            status = NsysStatus(
                STATUS_OK if path else STATUS_NSYS_MISSING,
                f"vLLM runs under `{' '.join(argv[:2])}` (pid {pid})" + ("" if path else f"; {NSYS_MISSING_HINT}"),
                under_nsys=True, nsys_path=path, launcher_pid=pid,
                session=flags.get("--session") or flags.get("--session-new"),
                output=flags.get("--output") or _short_flag(argv, "-o"),
                cuda_profiler_api=flags.get("--capture-range") == "cudaProfilerApi" or _short_flag(argv, "-c") == "cudaProfilerApi")
            return status
        pid = parents.get(pid)
    if _maps_mention(api.pid, proc_root, "libToolsInjection"):
        return NsysStatus(STATUS_OK if nsys_here else STATUS_NSYS_MISSING,
                          "Nsight Systems' injection library is loaded in the API server"
                          + ("" if nsys_here else f"; {NSYS_MISSING_HINT}"), under_nsys=True, nsys_path=nsys_here)
    if nsys_here is None:
        return NsysStatus(STATUS_NSYS_MISSING, NSYS_MISSING_HINT)
    return NsysStatus(STATUS_NOT_UNDER_NSYS, f"nsys is at {nsys_here} but vLLM does not run under `nsys launch`",
                      nsys_path=nsys_here)


def nsys_report(status: NsysStatus) -> str:
    """Where nsys writes the capture: its -o path plus .nsys-rep, or what names it when -o was not given."""
    if status.output:
        return status.output if status.output.endswith(".nsys-rep") else status.output + ".nsys-rep"
    where = f"nsys session {status.session}" if status.session else "nsys"
    return f"{where}: the default report (reportN.nsys-rep in the launcher's working directory)"


def _short_flag(argv: list[str], flag: str) -> str | None:
    """Value of a short option given as `-o value`."""
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[i + 1]
    return None


def _maps_mention(pid: int, proc_root: str | Path, needle: str) -> bool:
    """True if /proc/PID/maps names a file containing `needle` (False when unreadable)."""
    try:
        with open(Path(proc_root) / str(pid) / "maps", encoding="utf-8", errors="replace") as f:
            return any(needle in line for line in f)
    except OSError:
        return False
