"""Serving throughput of a real vLLM CPU server with py-spy captures running every few seconds vs without.

Starts the tiny model on loopback, then alternates bounded phases of closed-loop traffic
(baseline, dumps every N s, records every N s) so drift on a shared machine hits all modes alike,
and prints output tokens/s per phase, each mode's median against the baseline's, and the CPU
the py-spy runs themselves used (the robust figure on a busy machine). No assertions.

    .venv/bin/python bench/pyspy_overhead.py [--phase-s 15] [--rounds 4] [--every-s 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

from vllm_sentinel.agent.tiny_model import build_tiny_model
from vllm_sentinel.agent.traffic import TrafficPlan, run_traffic
from vllm_sentinel.agent.vllm_server import VllmServer, VllmServerConfig
from vllm_sentinel.collectors import pyspy as ps
from vllm_sentinel.collectors.process import discover


errors: set[str] = set()


def capture_loop(url: str, kind: str, every_s: float, record_s: int) -> None:
    """Child-process entry (the sidecar's place): capture every `every_s` s until SIGTERM, then print counts as JSON."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    procs = discover(url)
    spy = ps.PySpy()
    counts: dict[str, object] = {"captures": 0, "failed": 0, "errors": []}
    while not stop.wait(every_s):
        tc = ps.capture_target(url, spy, procs, instance=url, kind=kind, duration_s=record_s)
        counts["captures"] += 1  # type: ignore[operator]
        for c in tc.captures:
            if not c.ok:
                counts["failed"] += 1  # type: ignore[operator]
                counts["errors"].append(f"{c.role} {c.kind}: {c.status}: {c.error}")  # type: ignore[union-attr]
    counts["pyspy_cpu_ms"] = int(1000 * _children_cpu_s())
    print(json.dumps(counts), flush=True)


def phase(server: VllmServer, mode: str, seconds: float, every_s: float, record_s: int) -> tuple[float, dict[str, int]]:
    """Output tokens per second over one bounded traffic phase in `mode` (baseline|dump|record)."""
    counts: dict[str, int] = {"captures": 0, "failed": 0}
    loop = None
    if mode != "baseline":
        # a separate process, as the sidecar is: captures never share the load generator's GIL
        loop = subprocess.Popen([sys.executable, __file__, "--capture-loop", server.url, mode, str(every_s),
                                 str(record_s)], stdout=subprocess.PIPE, text=True)
    plan = TrafficPlan(requests=100_000, duration_s=seconds, concurrency=4, prompt_tokens=64, max_tokens=32)
    result = run_traffic(server.url, server.model_name, plan)
    if loop is not None:
        loop.terminate()
        out, _ = loop.communicate(timeout=120)
        got = json.loads(out.strip().splitlines()[-1])
        errors.update(got.pop("errors"))
        counts.update(got)
    counts["elapsed_ms"] = int(1000 * result.elapsed_s)
    return result.completion_tokens / result.elapsed_s, counts


def _children_cpu_s() -> float:
    """User+system CPU seconds of this process's reaped children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    """Run the phases and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=15.0, help="seconds of traffic per phase")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of (baseline, dump, record)")
    ap.add_argument("--every-s", type=float, default=3.0, help="seconds between captures")
    ap.add_argument("--record-s", type=int, default=1, help="length of each py-spy record")
    ap.add_argument("--modes", default="baseline,dump,record", help="comma-separated phases per round")
    ap.add_argument("--capture-loop", nargs=4, metavar=("URL", "KIND", "EVERY_S", "RECORD_S"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.capture_loop:
        url, kind, every_s, record_s = args.capture_loop
        capture_loop(url, kind, float(every_s), int(record_s))
        return

    server = VllmServer(VllmServerConfig(model_dir=build_tiny_model(), max_num_seqs=8, max_model_len=512),
                        startup_timeout_s=900)  # a busy 2-core machine can take minutes
    t0 = time.monotonic()
    server.start()
    print(f"vLLM ready on {server.url} in {time.monotonic() - t0:.0f} s; py-spy {ps.find_py_spy()}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    try:
        run_traffic(server.url, server.model_name, TrafficPlan(requests=16, concurrency=4, max_tokens=16))  # warm-up
        modes = ["baseline", *[m for m in args.modes.split(",") if m in ("dump", "record")]]
        results: dict[str, list[float]] = {m: [] for m in modes}
        cpu_share: dict[str, list[float]] = {m: [] for m in modes if m != "baseline"}
        for rnd in range(args.rounds):
            for mode in results:
                tps, counts = phase(server, mode, args.phase_s, args.every_s, args.record_s)
                results[mode].append(tps)
                extra = ""
                if mode != "baseline":
                    cpu = counts["pyspy_cpu_ms"]
                    extra = (f"  captures={counts['captures']} failed={counts['failed']} py-spy CPU {cpu} ms "
                             f"({cpu / max(1, counts['captures']):.0f} ms/capture, "
                             f"{100 * cpu / counts['elapsed_ms'] / (os.cpu_count() or 1):.2f} % of the machine)")
                    cpu_share[mode].append(cpu / counts["elapsed_ms"] / (os.cpu_count() or 1))
                print(f"round {rnd + 1} {mode:8s} {tps:8.1f} output tokens/s{extra}")
    finally:
        server.stop()
    for err in sorted(errors):
        print("capture error:", err)
    base = statistics.median(results["baseline"])
    print(f"\nmode    median tok/s  vs baseline   (phases of {args.phase_s:.0f} s, capture every "
          f"{args.every_s:.0f} s, record {args.record_s} s)")
    for mode, values in results.items():
        mean = statistics.median(values)
        share = f"   py-spy used {100 * statistics.mean(cpu_share[mode]):.2f} % of the CPUs" if mode in cpu_share else ""
        print(f"{mode:8s} {mean:11.1f}   {100 * (mean - base) / base:+10.1f} %   "
              f"(min {min(values):.1f}, max {max(values):.1f}){share}")


if __name__ == "__main__":
    main()
