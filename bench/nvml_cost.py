"""Print what each NVML call the collector makes costs, in microseconds (p50, p99, max).

    python3 bench/nvml_cost.py                  # live: call each getter on every GPU (needs a GPU)
    python3 bench/nvml_cost.py --trace FILE     # from a recorded trace (bench/device_nvml_run.py)

Live mode also times whole collector polls (fast tick, and a tick with the slow group).
Imports only the standard library, pynvml and collectors/ (runs on the bare device image).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def percentiles(samples_us: list[float]) -> tuple[float, float, float]:
    """(p50, p99, max) of a list of timings: [1, 2, 3] -> (2, 3, 3)."""
    s = sorted(samples_us)
    return s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))], s[-1]


def time_call(fn: Callable[[], Any], n: int) -> list[float] | str:
    """n timings of fn() in microseconds, or the error text when it fails."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report, do not stop
            return f"{type(exc).__name__}: {exc}"
        out.append((time.perf_counter() - start) * 1e6)
    return out


def live(n: int) -> None:
    import pynvml as nv

    from collectors.nvml import NvmlCollector

    start = time.perf_counter()
    nv.nvmlInit()
    print(f"nvmlInit: {(time.perf_counter() - start) * 1e3:.1f} ms; driver {nv.nvmlSystemGetDriverVersion()}")
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        print(f"GPU {i}: {nv.nvmlDeviceGetName(h)}")
        calls: list[tuple[str, Callable[[], Any], int]] = [
            ("GetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(h), n),
            ("GetMemoryInfo", lambda: nv.nvmlDeviceGetMemoryInfo(h), n),
            ("GetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h), n),
            ("GetClockInfo(SM)", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), n),
            ("GetTemperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), n),
            ("GetFieldValues(MEMORY_TEMP)", lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_MEMORY_TEMP]), n),
            ("GetCurrentClocksEventReasons", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h), n),
            ("GetComputeRunningProcesses", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), n),
            ("GetTotalEccErrors", lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC), n),
            ("GetRemappedRows", lambda: nv.nvmlDeviceGetRemappedRows(h), n),
            ("GetPowerManagementLimit", lambda: nv.nvmlDeviceGetPowerManagementLimit(h), n),
            ("GetTotalEnergyConsumption", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), max(10, n // 4)),
            ("GetPcieThroughput(TX)", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES), 20),
        ]
        try:
            if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                sample = nv.nvmlGpmSampleAlloc()
                calls.append(("GpmSampleGet", lambda: nv.nvmlGpmSampleGet(h, sample), n))
        except nv.NVMLError as exc:
            print(f"  GPM: {exc}")
        print(f"  {'call':32s} {'n':>5s} {'p50 us':>9s} {'p99 us':>9s} {'max us':>9s}")
        for name, fn, count in calls:
            result = time_call(fn, count)
            if isinstance(result, str):
                print(f"  {name:32s} {'':>5s} {result}")
            else:
                p50, p99, mx = percentiles(result)
                print(f"  {name:32s} {count:5d} {p50:9.1f} {p99:9.1f} {mx:9.1f}")
    nv.nvmlShutdown()

    collector = NvmlCollector(slow_interval_s=3600, events=False)
    collector.collect(int(time.time() * 1000))  # init + first slow group
    fast = []
    for _ in range(max(10, n // 4)):
        start = time.perf_counter()
        collector.collect(int(time.time() * 1000))
        fast.append((time.perf_counter() - start) * 1e6)
    p50, p99, mx = percentiles(fast)
    print(f"collector poll, fast tick (all GPUs): p50 {p50 / 1000:.2f} ms, p99 {p99 / 1000:.2f} ms, max {mx / 1000:.2f} ms")
    slow_ms = collector.status().detail.get("slow_poll_ms")
    print(f"collector slow group (PCIe, energy, ECC, rows, limits), last: {slow_ms} ms")
    collector.close()


def from_trace(path: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    by: dict[str, list[float]] = {}
    errors: dict[str, dict[int, int]] = {}
    with opener(path, "rt") as f:
        header = json.loads(f.readline())
        for line in f:
            rec = json.loads(line)
            if rec["fn"] == "nvmlEventSetWait_v2":
                continue  # blocks by design (its timeout), not a cost
            by.setdefault(rec["fn"], []).append(rec["us"])
            if "e" in rec:
                errors.setdefault(rec["fn"], {}).setdefault(rec["e"], 0)
                errors[rec["fn"]][rec["e"]] += 1
    print(f"trace {path}: driver {header.get('driver')}, {len(header.get('ticks_ms', []))} ticks")
    print(f"{'call':42s} {'n':>5s} {'p50 us':>9s} {'p99 us':>9s} {'max us':>9s}  errors")
    for fn, us in sorted(by.items(), key=lambda kv: -percentiles(kv[1])[0]):
        p50, p99, mx = percentiles(us)
        err = ", ".join(f"code {c} x{k}" for c, k in errors.get(fn, {}).items())
        print(f"{fn:42s} {len(us):5d} {p50:9.1f} {p99:9.1f} {mx:9.1f}  {err}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="summarise a recorded trace instead of calling NVML")
    parser.add_argument("-n", type=int, default=200, help="calls per getter in live mode")
    args = parser.parse_args()
    if args.trace:
        from_trace(args.trace)
    else:
        live(args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
