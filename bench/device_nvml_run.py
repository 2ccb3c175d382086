"""Run the NVML collector on a real GPU through two synthetic loads, recording every NVML call.

On the device (python3 with torch and nvidia-ml-py, nothing else needed):
    python3 bench/device_nvml_run.py --out "$OUT"
writes to --out:
  nvml-h200.prom            what the collector returned, `metric{labels} value ts_ms` per line
  nvml-h200-trace.jsonl.gz  every pynvml call (function, args, result or NVML error code, microseconds),
                            which tests/collectors/fakenvml.py replays
  summary.json              phase boundaries, per-phase means of the key series, collector status
The load runs in a child process (as vLLM's workers do): idle, memory-bound (large tensor copies),
idle gap, compute-bound (8192^3 bf16 matmuls), idle.
Imports only the standard library, collectors/base.py and collectors/nvml.py (plus pynvml, torch).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PHASES = [("idle", 4.0), ("memory_bound", 20.0), ("gap", 5.0), ("compute_bound", 20.0), ("tail", 4.0)]
KEY_SERIES = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE",
              "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
              "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
              "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
              "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_PROF_PCIE_TX_BYTES"]


# ---------------------------------------------------------------------------- the load (child)

def workload(phases: list[tuple[str, float]]) -> None:
    """Child process: allocate, print READY, then run each phase and print its boundaries."""
    import torch

    dev = torch.device("cuda")
    src = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    src.fill_(1)
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    out = torch.empty(8192, 8192, dtype=torch.bfloat16, device=dev)
    torch.mm(a, b, out=out)
    dst.copy_(src)
    torch.cuda.synchronize()
    print("READY", flush=True)
    for name, seconds in phases:
        start = time.time()
        end_at = start + seconds
        iterations = 0
        if name == "memory_bound":
            while time.time() < end_at:
                for _ in range(50):
                    dst.copy_(src)
                torch.cuda.synchronize()
                iterations += 50
        elif name == "compute_bound":
            while time.time() < end_at:
                for _ in range(50):
                    torch.mm(a, b, out=out)
                torch.cuda.synchronize()
                iterations += 50
        else:
            time.sleep(seconds)
        stop = time.time()
        rate = ""
        if name == "memory_bound":
            rate = f" {2 * src.numel() * iterations / (stop - start) / 1e12:.2f} TB/s (read+write)"
        elif name == "compute_bound":
            rate = f" {2 * 8192 ** 3 * iterations / (stop - start) / 1e12:.0f} TFLOP/s"
        print(f"PHASE {name} {int(start * 1000)} {int(stop * 1000)} {iterations}{rate}", flush=True)


# ---------------------------------------------------------------------------- recording proxy

class Recorder:
    """Wraps pynvml: each nvml* call is timed and recorded; everything else passes through."""

    def __init__(self, module: Any) -> None:
        self._mod = module
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._tokens: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        self.records: list[dict[str, Any]] = []
        self.constants: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._mod, name)
        if name.startswith("nvml") and callable(attr) and not isinstance(attr, type):
            def call(*args: Any, _fn: Any = attr, _name: str = name) -> Any:
                return self._call(_name, _fn, args)
            return call
        if isinstance(attr, int) and not isinstance(attr, bool):
            self.constants[name] = attr
        return attr

    def _call(self, name: str, fn: Any, args: tuple[Any, ...]) -> Any:
        rec: dict[str, Any] = {"fn": name, "th": threading.current_thread().name}
        start = time.perf_counter()
        try:
            result = fn(*args)
        except self._mod.NVMLError as exc:
            rec["us"] = round((time.perf_counter() - start) * 1e6, 1)
            rec["e"] = exc.value
            rec["a"] = self._args(name, args)
            self._append(rec, start)
            raise
        rec["us"] = round((time.perf_counter() - start) * 1e6, 1)
        if name == "nvmlDeviceGetHandleByIndex":
            self._tokens[self._addr(result)] = f"h:{args[0]}"
        elif name in ("nvmlGpmSampleAlloc", "nvmlEventSetCreate"):
            prefix = "gpm" if name == "nvmlGpmSampleAlloc" else "ev"
            n = self._counts.get(prefix, 0)
            self._counts[prefix] = n + 1
            self._tokens[self._addr(result)] = f"{prefix}:{n}"
        rec["a"] = self._args(name, args)
        rec["r"] = self._result(name, result, args)
        self._append(rec, start)
        return result

    def _append(self, rec: dict[str, Any], start: float) -> None:
        rec["t"] = round((start - self._t0) * 1000, 3)
        with self._lock:
            self.records.append(rec)

    @staticmethod
    def _addr(pointer: Any) -> int:
        return ctypes.cast(pointer, ctypes.c_void_p).value or 0

    def _args(self, name: str, args: tuple[Any, ...]) -> list[Any]:
        if name == "nvmlGpmMetricsGet":
            req = args[0]
            return [{"s1": self.ser(req.sample1), "s2": self.ser(req.sample2),
                     "ids": [int(req.metrics[k].metricId) for k in range(req.numMetrics)]}]
        return [self.ser(a) for a in args]

    def _result(self, name: str, result: Any, args: tuple[Any, ...]) -> Any:
        if name == "nvmlGpmMetricsGet":
            return {"metrics": [{"metricId": int(m.metricId), "nvmlReturn": int(m.nvmlReturn), "value": float(m.value)}
                                for m in (result.metrics[k] for k in range(result.numMetrics))]}
        if name == "nvmlDeviceGetFieldValues":
            members = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
            out = []
            for v in result:
                member = members.get(int(v.valueType))
                out.append({"fieldId": int(v.fieldId), "nvmlReturn": int(v.nvmlReturn),
                            "valueType": int(v.valueType),
                            "value": {member: getattr(v.value, member)} if member else {}})
            return out
        return self.ser(result)

    def ser(self, x: Any) -> Any:
        """ctypes and pynvml values -> JSON; pointers become tokens ('h:0', 'gpm:1', 'ev:0')."""
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, bytes):
            return x.decode(errors="replace")
        if isinstance(x, ctypes._Pointer):
            return self._tokens.get(self._addr(x), "ptr:?")
        if isinstance(x, (list, tuple, ctypes.Array)):
            return [self.ser(i) for i in x]
        if isinstance(x, ctypes.Structure):
            return {f[0]: self.ser(getattr(x, f[0])) for f in x._fields_}
        if isinstance(x, ctypes._SimpleCData):
            return x.value
        if hasattr(x, "__dict__"):
            return {k: self.ser(v) for k, v in vars(x).items()}
        return repr(x)


# ---------------------------------------------------------------------------- the run (parent)

def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--workload", action="store_true")
    args = parser.parse_args()
    if args.workload:
        workload(PHASES)
        return 0

    import pynvml

    from collectors.nvml import NvmlCollector

    recorder = Recorder(pynvml)
    collector = NvmlCollector(nvml=recorder, instance="h200", slow_interval_s=5.0)
    lines: list[str] = []
    phases: dict[str, list[int]] = {}
    ticks: list[int] = []
    events: list[dict[str, Any]] = []
    statuses: list[dict[str, Any]] = []

    def tick() -> None:
        now = int(time.time() * 1000)
        ticks.append(now)
        batch = collector.collect(now)
        for m, lab, v, ts in zip(batch.metrics, batch.labels, batch.values, batch.timestamps_ms):
            lines.append(f"{m}{{{lab}}} {_num(v)} {ts if ts is not None else batch.ts_ms}")
        for e in batch.events:
            events.append(vars(e))
        st = batch.status
        statuses.append({"ts": now, "ok": st.ok, "error": st.error, "poll_ms": st.detail.get("poll_ms"),
                         "slow_poll_ms": st.detail.get("slow_poll_ms")})

    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--workload"],
                             stdout=subprocess.PIPE, text=True)
    child_lines: list[str] = []

    def read_child() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            line = line.strip()
            child_lines.append(line)
            print("load:", line, flush=True)
            if line.startswith("PHASE"):
                _, name, start, stop = line.split()[:4]
                phases[name] = [int(start), int(stop)]

    reader = threading.Thread(target=read_child, daemon=True)
    reader.start()
    deadline = time.time() + 240
    next_tick = time.time()
    after_exit = 0
    while time.time() < deadline:
        tick()
        if child.poll() is not None:
            after_exit += 1
            if after_exit > 2:
                break
        next_tick += args.interval
        time.sleep(max(0.0, next_tick - time.time()))
    if child.poll() is None:
        child.kill()
    reader.join(5)
    child_pid = child.pid
    final_status = collector.status()
    collector.close()

    _write_outputs(args.out, args.interval, getattr(pynvml, "__version__", ""), recorder, final_status,
                   {"lines": lines, "ticks": ticks, "phases": phases, "events": events, "statuses": statuses,
                    "child_pid": child_pid, "child_lines": child_lines})
    return 0


def _write_outputs(out: str, interval: float, pynvml_version: str, recorder: "Recorder", final_status: Any,
                   run: dict[str, Any]) -> None:
    """The run's exposition, its NVML call trace and its summary into `out`; the summary's figures printed."""
    lines, ticks, phases, events = run["lines"], run["ticks"], run["phases"], run["events"]
    statuses, child_pid, child_lines = run["statuses"], run["child_pid"], run["child_lines"]
    os.makedirs(out, exist_ok=True)
    header = ("# NVML collector (collectors/nvml.py) on one NVIDIA H200, driver "
              f"{final_status.detail.get('driver')}, interval {interval}s; load phases (epoch ms): "
              + json.dumps(phases))
    with open(os.path.join(out, "nvml-h200.prom"), "w") as f:
        f.write(header + "\n" + "\n".join(lines) + "\n")
    with gzip.open(os.path.join(out, "nvml-h200-trace.jsonl.gz"), "wt") as f:
        f.write(json.dumps({"kind": "header", "pynvml": pynvml_version,
                            "driver": final_status.detail.get("driver"), "interval_s": interval,
                            "ticks_ms": ticks, "phases": phases, "constants": recorder.constants}) + "\n")
        for rec in recorder.records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    summary = {"phases": phases, "child_pid": child_pid, "child": child_lines, "events": events,
               "status": {"ok": final_status.ok, "error": final_status.error, "detail": final_status.detail},
               "polls": statuses, "means": _phase_means(lines, phases), "calls": _call_costs(recorder.records)}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(json.dumps({"means": summary["means"], "status": summary["status"]}, indent=1, default=str))
    print(f"samples {len(lines)}, nvml calls {len(recorder.records)}, events {len(events)}, child pid {child_pid}")


def _num(v: float | None) -> str:
    return "NaN" if v is None else repr(float(v))


def _phase_means(lines: list[str], phases: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """Mean of each key series inside each phase (skipping the first second of a phase)."""
    out: dict[str, dict[str, float]] = {}
    acc: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        metric = line.split("{", 1)[0]
        if metric not in KEY_SERIES:
            continue
        value, ts = line.rsplit(" ", 2)[1:]
        for name, (start, stop) in phases.items():
            if start + 1500 <= int(ts) <= stop:
                acc.setdefault((name, metric), []).append(float(value))
    for (name, metric), values in acc.items():
        out.setdefault(name, {})[metric] = round(sum(values) / len(values), 4)
    return out


def _call_costs(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    by: dict[str, list[float]] = {}
    for r in records:
        if r["fn"] != "nvmlEventSetWait_v2":
            by.setdefault(r["fn"], []).append(r["us"])
    out = {}
    for fn, us in sorted(by.items()):
        us.sort()
        out[fn] = {"n": len(us), "p50_us": us[len(us) // 2], "p99_us": us[min(len(us) - 1, int(len(us) * 0.99))],
                   "max_us": us[-1]}
    return out


if __name__ == "__main__":
    sys.exit(main())
