"""Stack captures of vLLM processes with py-spy, never pausing them (`--nonblocking`), bounded and rate-limited.

Two kinds: a `dump` (one snapshot of every thread, `py-spy dump --json`) and a `record` (a few
seconds of samples, `py-spy record --format raw --threads`, i.e. folded stacks with counts; by default
only running threads are sampled, so the stacks say where CPU goes; `idle=True` adds blocked threads).
Both end up as folded stacks, root first, one line per distinct stack:

    thread (4872): MainThread;worker_main (vllm/v1/executor/multiproc_executor.py:812);... 12

py-spy runs from an argument list (never a shell string), with a timeout, its output written to a
temporary file and read back only up to a size bound. Every failure is a Capture whose `status`
names the cause and the fix; nothing here raises on a missing tool, a permission or an exited process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .base import Event, now_ms
from .frames import ProcessProfile, summarize
from .process import ProcessDiscoveryError, discover, instance_of, read_state

KIND_DUMP = "dump"
KIND_RECORD = "record"

STATUS_OK = "ok"
STATUS_TRUNCATED = "truncated"  # output over the size bound: the stacks kept are a prefix
STATUS_MISSING = "py_spy_missing"
STATUS_PERMISSION = "permission_denied"
STATUS_EXITED = "process_exited"
STATUS_NOT_PYTHON = "not_python"
STATUS_TIMEOUT = "timeout"
STATUS_FAILED = "failed"
STATUS_RATE_LIMITED = "rate_limited"
STATUS_NO_PROCESSES = "no_processes"  # the target's vLLM processes were not found

DEFAULT_TIMEOUT_S = 20.0
DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024
# sampling rate of `record`: py-spy's default is 100/s; 50/s halves the (small) cost and is plenty for seconds
DEFAULT_RECORD_RATE = 50

FIX_MISSING = ("py-spy is not installed or not on PATH: `pip install py-spy` (or `pip install "
               "vllm-sentinel[pyspy]`) in the sidecar's environment, or pass its path")
FIX_NOT_PYTHON = "the process is not a Python interpreter py-spy understands (or its Python is too new for this py-spy)"


@dataclass
class RunResult:
    """What running one py-spy command gave: exit code, output (bounded), error text, and flags."""

    returncode: int | None
    stdout: bytes
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    missing: bool = False


Runner = Callable[[list[str], float, int], RunResult]


class VllmProcessLike(Protocol):
    """What a capture needs to know of a process (collectors.process.VllmProcess has it)."""

    pid: int
    role: str


def run_bounded(argv: list[str], timeout_s: float, max_bytes: int) -> RunResult:
    """Run argv (no shell) with a timeout; stdout goes to a temp file and at most max_bytes are read back."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            # a session of its own: with autogroup scheduling (kernel.sched_autogroup_enabled) a
            # py-spy waiting for a CPU on a busy host would otherwise hold back its caller's whole
            # session (measured: a load generator sharing it lost 40-60 % of its throughput)
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,  # noqa: S603
                                    env={**os.environ, "RUST_BACKTRACE": "0"}, start_new_session=True)
        except FileNotFoundError:
            return RunResult(None, b"", f"{argv[0]}: not found", missing=True)
        except PermissionError as exc:
            return RunResult(None, b"", f"{argv[0]}: {exc}", missing=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        size = out.seek(0, os.SEEK_END)
        out.seek(0)
        stdout = out.read(max_bytes)
        err.seek(0)
        stderr = err.read(16 * 1024).decode("utf-8", "replace")
    return RunResult(proc.returncode, stdout, stderr, timed_out=timed_out, truncated=size > max_bytes)


@dataclass
class ThreadStack:
    """One thread of a dump: frames root first, as 'function (file:line)'; `active` is py-spy's not-idle flag."""

    thread_id: int
    name: str
    active: bool
    owns_gil: bool
    frames: list[str]


@dataclass
class Capture:
    """One py-spy capture of one process, as plain data; `stacks` maps folded stack -> samples."""

    capture_id: str
    ts_ms: int
    instance: str
    pid: int
    role: str
    kind: str
    status: str
    error: str | None = None
    incident_id: str | None = None
    duration_ms: int = 0
    stacks: dict[str, int] = field(default_factory=dict)
    threads: list[ThreadStack] = field(default_factory=list)  # dumps only
    idle_included: bool = True  # False for a record of running threads only (every sample was on CPU)
    process_state: str = ""  # /proc/PID/stat state when the capture started: R, S, D, T (stopped), Z ...

    @property
    def ok(self) -> bool:
        """True when stacks were captured (possibly truncated)."""
        return self.status in (STATUS_OK, STATUS_TRUNCATED)

    @property
    def samples(self) -> int:
        """Total samples over all stacks (a dump counts one per thread)."""
        return sum(self.stacks.values())

    def folded_text(self) -> str:
        """Folded stacks in flamegraph.pl format: 'a;b;c 12' per line, most samples first."""
        return "".join(f"{s} {n}\n" for s, n in sorted(self.stacks.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def stopped(self) -> bool:
        """True when the process was stopped (SIGSTOP, a debugger): its stacks are where it is frozen."""
        return self.process_state in ("T", "t")

    def profile(self, top: int = 10) -> ProcessProfile:
        """Class shares, hot frames and the main thread's stack (collectors.frames.summarize)."""
        return summarize(self.stacks, self.pid, self.role, top, active=None if self.idle_included else True)

    def to_row(self) -> dict[str, object]:
        """The row for the store's `captures` table (agent/store/migrations.py's CAPTURES_TABLE)."""
        return {
            "capture_id": self.capture_id, "ts": self.ts_ms, "instance": self.instance,
            "incident_id": self.incident_id, "pid": self.pid, "role": self.role, "kind": self.kind,
            "status": self.status, "error": self.error, "duration_ms": self.duration_ms,
            "samples": self.samples, "folded": self.folded_text() if self.stacks else None,
            "idle_included": self.idle_included, "process_state": self.process_state, "artifact": None,
        }

    def to_event(self) -> Event:
        """A timeline event for this capture (the `events` table), so reports can point at it."""
        labels = {"capture_id": self.capture_id, "pid": str(self.pid), "role": self.role,
                  "kind": self.kind, "status": self.status}
        if self.incident_id:
            labels["incident_id"] = self.incident_id
        message = (f"py-spy {self.kind} of {self.role} pid {self.pid}: {self.samples} samples"
                   if self.ok else f"py-spy {self.kind} of {self.role} pid {self.pid} failed: {self.error}")
        if self.stopped:
            message += " (the process is stopped: SIGSTOP or a debugger holds it)"
        return Event(self.ts_ms, self.instance, "pyspy_capture", labels, message)


def parse_dump_json(data: bytes | str) -> list[ThreadStack]:
    """Threads of `py-spy dump --json` output, frames turned root first; raise ValueError on bad JSON."""
    threads = []
    for t in json.loads(data):
        frames = [f"{f['name']} ({f.get('short_filename') or f['filename']}:{f.get('line', 0)})"
                  for f in reversed(t.get("frames") or [])]
        threads.append(ThreadStack(
            thread_id=int(t.get("os_thread_id") or t.get("thread_id") or 0),
            name=t.get("thread_name") or "",
            active=bool(t.get("active", True)),
            owns_gil=bool(t.get("owns_gil", False)),
            frames=frames,
        ))
    return threads


def dump_to_folded(threads: list[ThreadStack]) -> dict[str, int]:
    """Dump threads as folded stacks, one sample each, in record's `--threads` shape plus py-spy's activity.

    ThreadStack(4872, 'MainThread', frames=['main (a.py:1)', 'f (b.py:2)']) ->
    {'thread (4872): MainThread [active];main (a.py:1);f (b.py:2)': 1}
    """
    stacks: dict[str, int] = {}
    for t in threads:
        state = "active" if t.active else "idle"
        key = ";".join([f"thread ({t.thread_id}): {t.name or 'thread'} [{state}]", *t.frames])
        stacks[key] = stacks.get(key, 0) + 1
    return stacks


def parse_folded(text: str) -> dict[str, int]:
    """Folded stacks ('a;b;c 12' per line) -> {stack: count}; lines without a count are skipped."""
    stacks: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks[stack] = stacks.get(stack, 0) + int(count)
    return stacks


def classify_failure(result: RunResult, pid: int, proc_root: str | Path = "/proc") -> tuple[str, str]:
    """(status, error message with the fix) for a py-spy run that gave no usable output."""
    text = result.stderr + "\n" + result.stdout[:4096].decode("utf-8", "replace")
    low = text.lower()
    if result.missing:
        return STATUS_MISSING, FIX_MISSING
    if not (Path(proc_root) / str(pid)).exists() or "check that the process is running" in low \
            or "no such process" in low:
        return STATUS_EXITED, f"process {pid} exited before or during the capture"
    if "permission denied" in low or "operation not permitted" in low or "(os error 1)" in low:
        return STATUS_PERMISSION, permission_fix(proc_root)
    if result.timed_out:
        return STATUS_TIMEOUT, "py-spy did not finish in time (a very busy host or a huge process); raise the capture timeout"
    if "failed to find python version" in low or "failed to find a python interpreter" in low:
        return STATUS_NOT_PYTHON, FIX_NOT_PYTHON
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("py-spy>")), "")
    return STATUS_FAILED, f"py-spy failed (exit {result.returncode}): {first[:300]}"


def permission_fix(proc_root: str | Path = "/proc") -> str:
    """The EPERM message, naming the ptrace setting in force where it can be read."""
    msg = ("py-spy may not read the process's memory (EPERM, ptrace): run the sidecar as root or as "
           "vLLM's user, and in a container grant CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE; "
           "Kubernetes securityContext.capabilities.add: [SYS_PTRACE])")
    try:
        scope = (Path(proc_root) / "sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return msg
    if scope != "0":
        msg += (f"; kernel.yama.ptrace_scope is {scope}: without CAP_SYS_PTRACE only a parent may trace "
                "(sysctl -w kernel.yama.ptrace_scope=0)")
    return msg


class RateLimiter:
    """At most one capture per target and reason every `per_target_s` seconds, `per_incident` per incident.

    The reason is the incident kind that asked: a queue_blocking capture does not use up the slot of the
    engine_stall that follows it 20 s later, whose stacks exist only while the engine is frozen."""

    def __init__(self, per_target_s: float = 30.0, per_incident: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_target_s = per_target_s
        self.per_incident = per_incident
        self.clock = clock
        self._last: dict[tuple[str, str | None], float] = {}
        self._incident_counts: dict[str, int] = {}

    def check(self, target: str, incident_id: str | None = None, reason: str | None = None) -> str | None:
        """None if a capture may run now, else why not (nothing is recorded; call `take` when it runs)."""
        last = self._last.get((target, reason))
        if last is not None and self.clock() - last < self.per_target_s:
            wait = self.per_target_s - (self.clock() - last)
            why = f" for {reason}" if reason else ""
            return (f"{target} was captured{why} {self.clock() - last:.0f} s ago; "
                    f"next capture allowed in {wait:.0f} s")
        if incident_id is not None and self._incident_counts.get(incident_id, 0) >= self.per_incident:
            return f"incident {incident_id} already has {self.per_incident} captures"
        return None

    def take(self, target: str, incident_id: str | None = None, reason: str | None = None) -> None:
        """Record that a capture of `target` (for `incident_id`, of kind `reason`) starts now."""
        self._last[(target, reason)] = self.clock()
        if incident_id is not None:
            self._incident_counts[incident_id] = self._incident_counts.get(incident_id, 0) + 1


def process_state(pid: int, proc_root: str | Path = "/proc") -> str:
    """State letter of a process from /proc/PID/stat ('R', 'S', 'D', 'T' stopped, 'Z' ...); '' if gone."""
    return read_state(pid, proc_root) or ""


def find_py_spy(explicit: str | None = None) -> str | None:
    """Path of the py-spy binary: `explicit`, else PATH, else beside this Python (a venv's bin/)."""
    if explicit:
        return explicit
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else None


class PySpy:
    """Runs py-spy captures of single processes; `run` and `py_spy` are injectable (tests, setpriv wrappers)."""

    def __init__(self, py_spy: str | list[str] | None = None, run: Runner = run_bounded,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 rate: int = DEFAULT_RECORD_RATE, proc_root: str | Path = "/proc", dump_retries: int = 2) -> None:
        if isinstance(py_spy, list):
            self.command: list[str] | None = list(py_spy)
        else:
            path = find_py_spy(py_spy)
            self.command = [path] if path else None
        self.run = run
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.rate = rate
        self.proc_root = proc_root
        self.dump_retries = dump_retries

    def dump(self, pid: int, role: str, instance: str, incident_id: str | None = None) -> Capture:
        """One snapshot of every thread of `pid` (py-spy dump --json --nonblocking)."""
        cap = self._new(pid, role, instance, KIND_DUMP, incident_id)
        if self.command is None:
            return self._fail(cap, STATUS_MISSING, FIX_MISSING)
        argv = [*self.command, "dump", "--json", "--nonblocking", "--pid", str(pid)]
        t0 = time.monotonic()
        for attempt in range(1 + self.dump_retries):
            result = self.run(argv, self.timeout_s, self.max_output_bytes)
            cap.duration_ms = int((time.monotonic() - t0) * 1000)
            if result.truncated:
                # half a JSON document cannot be parsed: a dump over the bound is a failure, not a prefix
                return self._fail(cap, STATUS_FAILED,
                                  f"py-spy dump output exceeded {self.max_output_bytes} bytes; raise max_output_bytes")
            if result.returncode != 0 or result.timed_out or not result.stdout.strip():
                status, error = classify_failure(result, pid, self.proc_root)
                # --nonblocking reads memory the interpreter is changing: a torn read fails; try again
                if status == STATUS_FAILED and attempt < self.dump_retries:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                return self._fail(cap, status, error + (f" (after {attempt + 1} attempts)" if attempt else ""))
            try:
                cap.threads = parse_dump_json(result.stdout)
            except (ValueError, KeyError, TypeError) as exc:
                return self._fail(cap, STATUS_FAILED, f"py-spy dump output is not the expected JSON: {exc}")
            cap.stacks = dump_to_folded(cap.threads)
            return cap
        raise AssertionError("unreachable")  # the loop always returns

    def record(self, pid: int, role: str, instance: str, duration_s: int = 3,
               incident_id: str | None = None, idle: bool = False) -> Capture:
        """`duration_s` seconds of samples of the running threads (all threads with idle=True), py-spy record --format raw."""
        cap = self._new(pid, role, instance, KIND_RECORD, incident_id)
        cap.idle_included = idle
        if self.command is None:
            return self._fail(cap, STATUS_MISSING, FIX_MISSING)
        with tempfile.TemporaryDirectory(prefix="vllm-sentinel-pyspy-") as tmp:
            out = Path(tmp) / "stacks.txt"
            argv = [*self.command, "record", "--nonblocking", "--format", "raw", "--threads",
                    *(["--idle"] if idle else []),
                    "--rate", str(self.rate), "--duration", str(int(duration_s)),
                    "--output", str(out), "--pid", str(pid)]
            t0 = time.monotonic()
            result = self.run(argv, self.timeout_s + duration_s, self.max_output_bytes)
            cap.duration_ms = int((time.monotonic() - t0) * 1000)
            text, truncated = _read_bounded(out, self.max_output_bytes)
        if not text.strip():
            if result.returncode == 0 and not result.timed_out:
                # py-spy ran and wrote nothing: no thread was on CPU during the window
                cap.error = "no thread ran during the capture: the process was idle or blocked (record with idle=True or dump to see where)"
                return cap
            return self._fail(cap, *classify_failure(result, pid, self.proc_root))
        if truncated:
            text = text[: text.rfind("\n") + 1]  # drop the cut last line
            cap.status, cap.error = STATUS_TRUNCATED, f"output over {self.max_output_bytes} bytes: kept a prefix"
        cap.stacks = parse_folded(text)
        return cap

    def _new(self, pid: int, role: str, instance: str, kind: str, incident_id: str | None) -> Capture:
        return Capture(capture_id=uuid.uuid4().hex[:16], ts_ms=now_ms(), instance=instance, pid=pid,
                       role=role, kind=kind, status=STATUS_OK, incident_id=incident_id,
                       process_state=process_state(pid, self.proc_root))

    @staticmethod
    def _fail(cap: Capture, status: str, error: str) -> Capture:
        cap.status, cap.error = status, error
        return cap


def _read_bounded(path: Path, max_bytes: int) -> tuple[str, bool]:
    """Up to max_bytes of a file as text, and whether it was longer; ('', False) if missing."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError:
        return "", False
    return data[:max_bytes].decode("utf-8", "replace"), len(data) > max_bytes


@dataclass
class TargetCapture:
    """Captures of every vLLM process of one target, taken together; `status` is 'ok' or why none ran."""

    target: str
    instance: str
    status: str
    error: str | None = None
    captures: list[Capture] = field(default_factory=list)

    def events(self) -> list[Event]:
        """Timeline events for the captures (or one for the refusal)."""
        if self.captures:
            return [c.to_event() for c in self.captures]
        return [Event(now_ms(), self.instance, "pyspy_capture", {"status": self.status}, self.error or "")]


def capture_target(target: str, spy: PySpy, processes: list[VllmProcessLike], *, instance: str,
                   kind: str = KIND_DUMP, duration_s: int = 3, incident_id: str | None = None,
                   limiter: RateLimiter | None = None, idle: bool = False,
                   reason: str | None = None) -> TargetCapture:
    """Capture all `processes` of a target at once (one py-spy per process, in parallel), rate-limited
    per target and `reason` (the incident kind that asks).

    `processes` come from collectors.process.discover (anything with pid and role).
    """
    if limiter is not None:
        refusal = limiter.check(target, incident_id, reason)
        if refusal is not None:
            return TargetCapture(target, instance, STATUS_RATE_LIMITED, refusal)
        limiter.take(target, incident_id, reason)
    if not processes:
        return TargetCapture(target, instance, STATUS_NO_PROCESSES, f"no vLLM processes found for {target}")
    if spy.command is None:
        return TargetCapture(target, instance, STATUS_MISSING, FIX_MISSING)

    def one(proc: VllmProcessLike) -> Capture:
        if kind == KIND_RECORD:
            return spy.record(proc.pid, proc.role, instance, duration_s, incident_id, idle=idle)
        return spy.dump(proc.pid, proc.role, instance, incident_id)

    # in parallel, so the stacks of API server, engine and workers describe the same moment
    with ThreadPoolExecutor(max_workers=min(8, len(processes)), thread_name_prefix="pyspy") as pool:
        captures = list(pool.map(one, processes))
    good = [c for c in captures if c.ok]
    if good:
        return TargetCapture(target, instance, STATUS_OK, None, captures)
    first = captures[0]
    return TargetCapture(target, instance, first.status, first.error, captures)


def capture_now(target: str, *, instance: str | None = None, kind: str = KIND_DUMP, duration_s: int = 3,
                incident_id: str | None = None, limiter: RateLimiter | None = None, spy: PySpy | None = None,
                proc_root: str | Path = "/proc", idle: bool = False) -> TargetCapture:
    """Discover the target's vLLM processes and capture them (what `vllm-sentinel capture --target` runs)."""
    instance = instance or instance_of(target)
    try:
        processes = discover(target, proc_root)
    except ProcessDiscoveryError as exc:
        return TargetCapture(target, instance, STATUS_NO_PROCESSES, str(exc))
    return capture_target(target, spy or PySpy(proc_root=proc_root), processes, instance=instance, kind=kind,
                          duration_s=duration_s, incident_id=incident_id, limiter=limiter, idle=idle)
