"""A pynvml stand-in that replays NVML calls recorded on a real GPU, plus injected failures.

The trace (tests/collectors/fixtures/nvml/*.jsonl.gz, written by bench/device_nvml_run.py) holds
one JSON line per pynvml call: function, arguments (device handles as tokens 'h:0', GPM samples
as 'gpm:0'), and the result or the NVML error code. Each (function, arguments) pair replays its
recorded outcomes in order and then repeats the last one, so a collector that makes the same
calls as on the device gets the device's answers. Failures the H200 could not be made to show
(GPU_IS_LOST, LIBRARY_NOT_FOUND, NO_PERMISSION, ...) are injected with `fail()`; calls that were
never recorded are kept in `unrecorded` and answered NOT_SUPPORTED, so tests can assert on them.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
H200_TRACE = FIXTURES / "nvml-h200-trace.jsonl.gz"
H200_DUMP = FIXTURES / "nvml-h200.prom.gz"

# NVML's error codes (nvml.h); the recorded trace names only the constants the collector read.
ERRORS = {"UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
          "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7, "DRIVER_NOT_LOADED": 9,
          "TIMEOUT": 10, "LIBRARY_NOT_FOUND": 12, "FUNCTION_NOT_FOUND": 13, "GPU_IS_LOST": 15,
          "RESET_REQUIRED": 16, "LIB_RM_VERSION_MISMATCH": 18, "ARGUMENT_VERSION_MISMATCH": 25,
          "UNKNOWN": 999}


class NVMLError(Exception):
    """Same shape as pynvml.NVMLError: the NVML return code in `.value`."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        names = {v: k for k, v in ERRORS.items()}
        return names.get(self.value, f"NVML error {self.value}").replace("_", " ").title()


def _ns(value: Any) -> Any:
    """JSON -> attribute objects, as ctypes structs read: {'gpu': 1} -> obj.gpu == 1."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _ns(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_ns(v) for v in value]
    return value


class FakeNvml:
    """Replays a recorded trace; `fail()` injects NVML errors; `push_event()` feeds the event set."""

    NVMLError = NVMLError

    def __init__(self, trace: Path = H200_TRACE) -> None:
        with gzip.open(trace, "rt") as f:
            self.header = json.loads(f.readline())
            records = [json.loads(line) for line in f]
        for name, value in self.header["constants"].items():
            setattr(self, name, value)
        for name, value in ERRORS.items():
            setattr(self, f"NVML_ERROR_{name}", value)
        self._queues: dict[tuple[str, str], deque[dict[str, Any]]] = {}
        for rec in records:
            if rec["fn"] == "nvmlEventSetWait_v2":
                continue  # waits depend on time; events come from push_event()
            self._queues.setdefault((rec["fn"], self._key(rec["a"])), deque()).append(rec)
        self.calls: list[tuple[str, list[Any]]] = []
        self.unrecorded: list[tuple[str, list[Any]]] = []
        self._failures: list[dict[str, Any]] = []
        self._overrides: dict[str, Any] = {}
        self._events: deque[SimpleNamespace] = deque()
        self._cond = threading.Condition()
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- test controls

    def fail(self, fn: str, code: int, times: int | None = None, handle: str | None = None) -> None:
        """Make `fn` raise NVMLError(code) (for `times` calls, or for good; only for `handle` if given)."""
        self._failures.append({"fn": fn, "code": code, "left": times, "handle": handle})

    def answer(self, fn: str, result: Any) -> None:
        """Make `fn` return `result` whatever was recorded (e.g. nvmlDeviceGetCount -> 0)."""
        self._overrides[fn] = result

    def push_event(self, gpu: int, event_type: int, data: int) -> None:
        """Queue one NVML event (e.g. nvmlEventTypeXidCriticalError, 79) for nvmlEventSetWait."""
        with self._cond:
            self._events.append(SimpleNamespace(device=f"h:{gpu}", eventType=event_type, eventData=data,
                                                gpuInstanceId=0, computeInstanceId=0))
            self._cond.notify_all()

    def count(self, fn: str) -> int:
        """How many times the collector called `fn`."""
        with self._lock:
            return sum(1 for name, _ in self.calls if name == fn)

    # ---------------------------------------------------------------- pynvml surface

    def c_nvmlGpmMetricsGet_t(self) -> SimpleNamespace:
        """The request struct nvmlGpmMetricsGet fills in."""
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(64)])

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> SimpleNamespace:
        self._record("nvmlEventSetWait_v2", [event_set, timeout_ms])
        self._maybe_fail("nvmlEventSetWait_v2", [event_set])
        with self._cond:
            if not self._events:
                self._cond.wait(timeout_ms / 1000)
            if self._events:
                return self._events.popleft()
        raise NVMLError(ERRORS["TIMEOUT"])

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        self._record("nvmlDeviceGetIndex", [handle])
        return int(str(handle).split(":")[1])

    def nvmlGpmMetricsGet(self, request: SimpleNamespace) -> SimpleNamespace:
        args = [{"s1": request.sample1, "s2": request.sample2,
                 "ids": [request.metrics[k].metricId for k in range(request.numMetrics)]}]
        result = self._replay("nvmlGpmMetricsGet", args)
        by_id = {m["metricId"]: m for m in result["metrics"]}
        for k in range(request.numMetrics):
            recorded = by_id.get(request.metrics[k].metricId)
            if recorded is None:
                request.metrics[k].nvmlReturn = ERRORS["NOT_SUPPORTED"]
            else:
                request.metrics[k].nvmlReturn = recorded["nvmlReturn"]
                request.metrics[k].value = recorded["value"]
        return request

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and not name.startswith(("nvmlEventType", "nvmlClocks")):
            def call(*args: Any) -> Any:
                return _ns(self._replay(name, list(args)))
            return call
        raise AttributeError(name)

    # ---------------------------------------------------------------- replay

    @staticmethod
    def _key(args: list[Any]) -> str:
        return json.dumps(args, sort_keys=True)

    def _record(self, fn: str, args: list[Any]) -> None:
        with self._lock:
            self.calls.append((fn, args))

    def _maybe_fail(self, fn: str, args: list[Any]) -> None:
        for failure in self._failures:
            if failure["fn"] != fn or failure["left"] == 0:
                continue
            if failure["handle"] is not None and (not args or args[0] != failure["handle"]):
                continue
            if failure["left"] is not None:
                failure["left"] -= 1
            raise NVMLError(failure["code"])

    def _replay(self, fn: str, args: list[Any]) -> Any:
        self._record(fn, args)
        self._maybe_fail(fn, args)
        if fn in self._overrides:
            return self._overrides[fn]
        queue = self._queues.get((fn, self._key(args)))
        if not queue:
            with self._lock:
                self.unrecorded.append((fn, args))
            raise NVMLError(ERRORS["NOT_SUPPORTED"])
        rec = queue.popleft() if len(queue) > 1 else queue[0]
        if "e" in rec:
            raise NVMLError(rec["e"])
        return rec["r"]


def read_dump(path: Path = H200_DUMP) -> list[tuple[str, str, float, int]]:
    """The recorded samples as (metric, label text, value, ts_ms), in file order."""
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            series, value, ts = line.rsplit(" ", 2)
            metric, labels = series.split("{", 1)
            out.append((metric, labels[:-1], float(value), int(ts)))
    return out


def dump_phases(path: Path = H200_DUMP) -> dict[str, list[int]]:
    """Load phases (name -> [start_ms, end_ms]) from the dump's header comment."""
    with gzip.open(path, "rt") as f:
        header = f.readline()
    return json.loads(header.split("load phases (epoch ms): ", 1)[1])
