"""Serving throughput of a real vLLM CPU server with py-spy captures running every few seconds vs without.

Starts the tiny model on loopback and runs bounded phases of closed-loop traffic, one mode each:

    baseline  nothing else runs
    dump      a capture process (the sidecar's place) runs `py-spy dump` of every vLLM process every N s
    record    the same with a short `py-spy record` instead
    control   the same process starts, every N s, a child that only burns as much CPU as a py-spy
              capture did (no py-spy, no ptrace, no reads of vLLM's memory)

The control separates what py-spy costs from what *any* short-lived process costs on the machine:
on a 2-vCPU VM, vLLM's CPU backend (a worker bound to one core, engine and API server on the other,
spin-then-sleep hand-offs between them) loses far more throughput to a 40 ms CPU blip every few
seconds than the blip's CPU share. Phases are separated by idle time (--settle-s) so each starts in
the same state, modes rotate so drift hits all alike, and each mode's median is compared with the
baseline's and with the control's. Prints figures; asserts nothing.

    .venv/bin/python bench/pyspy_overhead.py [--phase-s 15] [--rounds 4] [--every-s 3] [--modes ...]
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

MODES = ("baseline", "dump", "record", "control")
# a child that burns `ms` of CPU and exits: the control's stand-in for one capture (-S: no site import)
_BURN = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < float(sys.argv[1]) / 1000: pass"

errors: set[str] = set()


def _children_cpu_s() -> float:
    """User+system CPU seconds of this process's reaped children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def capture_loop(url: str, kind: str, every_s: float, record_s: int, burn_ms: float) -> None:
    """Child-process entry (the sidecar's place): capture (or burn) every `every_s` s until SIGTERM; print JSON."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    procs = discover(url)
    spy = ps.PySpy()
    counts: dict[str, object] = {"events": 0, "failed": 0, "errors": [], "wall_ms": []}
    while not stop.wait(every_s):
        t0 = time.monotonic()
        if kind == "control":
            subprocess.run([sys.executable, "-S", "-c", _BURN, str(burn_ms)], check=True)
        else:
            tc = ps.capture_target(url, spy, procs, instance=url, kind=kind, duration_s=record_s)
            for c in tc.captures:
                if not c.ok:
                    counts["failed"] += 1  # type: ignore[operator]
                    counts["errors"].append(f"{c.role} {c.kind}: {c.status}: {c.error}")  # type: ignore[union-attr]
        counts["wall_ms"].append(int(1000 * (time.monotonic() - t0)))  # type: ignore[union-attr]
        counts["events"] += 1  # type: ignore[operator]
    counts["child_cpu_ms"] = int(1000 * _children_cpu_s())
    print(json.dumps(counts), flush=True)


def phase(server: VllmServer, mode: str, seconds: float, every_s: float, record_s: int,
          burn_ms: float) -> tuple[float, dict]:
    """Output tokens per second over one bounded traffic phase in `mode`, and the capture loop's tallies."""
    loop = None
    if mode != "baseline":
        # a separate process, as the sidecar is: captures never share the load generator's GIL
        loop = subprocess.Popen([sys.executable, __file__, "--capture-loop", server.url, mode, str(every_s),
                                 str(record_s), str(burn_ms)], stdout=subprocess.PIPE, text=True)
    plan = TrafficPlan(requests=100_000, duration_s=seconds, concurrency=4, prompt_tokens=64, max_tokens=32)
    result = run_traffic(server.url, server.model_name, plan)
    counts: dict = {"elapsed_ms": int(1000 * result.elapsed_s)}
    if loop is not None:
        loop.terminate()
        out, _ = loop.communicate(timeout=120)
        got = json.loads(out.strip().splitlines()[-1])
        errors.update(got.pop("errors"))
        counts.update(got)
    return result.completion_tokens / result.elapsed_s, counts


def calibrate_burn_ms(url: str, n: int = 5) -> float:
    """CPU milliseconds one dump of all the target's processes costs (py-spy children), idle server."""
    procs = discover(url)
    spy = ps.PySpy()
    before = _children_cpu_s()
    for _ in range(n):
        ps.capture_target(url, spy, procs, instance=url, kind="dump")
    return 1000 * (_children_cpu_s() - before) / n


def main() -> None:
    """Run the phases and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=15.0, help="seconds of traffic per phase")
    ap.add_argument("--settle-s", type=float, default=10.0, help="idle seconds before each phase")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the modes")
    ap.add_argument("--every-s", type=float, default=3.0, help="seconds between captures")
    ap.add_argument("--record-s", type=int, default=1, help="length of each py-spy record")
    ap.add_argument("--modes", default="baseline,dump,control", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--capture-loop", nargs=5, metavar=("URL", "KIND", "EVERY_S", "RECORD_S", "BURN_MS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.capture_loop:
        url, kind, every_s, record_s, burn_ms = args.capture_loop
        capture_loop(url, kind, float(every_s), int(record_s), float(burn_ms))
        return
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(sorted(unknown))}; choose from {', '.join(MODES)}")

    server = VllmServer(VllmServerConfig(model_dir=build_tiny_model(), max_num_seqs=8, max_model_len=512),
                        startup_timeout_s=900)  # a busy 2-core machine can take minutes
    t0 = time.monotonic()
    server.start()
    ncpu = os.cpu_count() or 1
    print(f"vLLM ready on {server.url} in {time.monotonic() - t0:.0f} s; py-spy {ps.find_py_spy()}; "
          f"load average {os.getloadavg()[0]:.1f} on {ncpu} CPUs")
    try:
        run_traffic(server.url, server.model_name, TrafficPlan(requests=16, concurrency=4, max_tokens=16))  # warm-up
        burn_ms = calibrate_burn_ms(server.url)
        print(f"one dump of all vLLM processes costs {burn_ms:.0f} ms of py-spy CPU; the control burns that much")
        modes = ["baseline", *[m for m in MODES[1:] if m in args.modes.split(",")]]
        results: dict[str, list[float]] = {m: [] for m in modes}
        cpu_per_event: dict[str, list[float]] = {m: [] for m in modes if m != "baseline"}
        for rnd in range(args.rounds):
            for mode in modes:
                time.sleep(args.settle_s)
                tps, counts = phase(server, mode, args.phase_s, args.every_s, args.record_s, burn_ms)
                results[mode].append(tps)
                extra = ""
                if mode != "baseline":
                    events = max(1, counts["events"])
                    cpu = counts["child_cpu_ms"]
                    walls = counts["wall_ms"] or [0]
                    cpu_per_event[mode].append(cpu / events)
                    extra = (f"  events={counts['events']} failed={counts['failed']} child CPU {cpu / events:.0f} ms/event "
                             f"({100 * cpu / counts['elapsed_ms'] / ncpu:.2f} % of the machine), wall median "
                             f"{statistics.median(walls)} ms max {max(walls)} ms")
                print(f"round {rnd + 1} {mode:8s} {tps:8.1f} output tokens/s{extra}", flush=True)
    finally:
        server.stop()
    for err in sorted(errors):
        print("capture error:", err)
    base = statistics.median(results["baseline"])
    control = statistics.median(results["control"]) if results.get("control") else None
    print(f"\nmode     median tok/s  vs baseline  vs control   (phases of {args.phase_s:.0f} s after {args.settle_s:.0f} s "
          f"idle, an event every {args.every_s:.0f} s, record {args.record_s} s, {args.rounds} rounds)")
    for mode, values in results.items():
        med = statistics.median(values)
        vs_control = f"{100 * (med - control) / control:+9.1f} %" if control and mode not in ("baseline", "control") else " " * 11
        cpu = (f"   {statistics.mean(cpu_per_event[mode]):.0f} ms CPU/event" if mode in cpu_per_event else "")
        print(f"{mode:8s} {med:11.1f}   {100 * (med - base) / base:+9.1f} %  {vs_control}   "
              f"(min {min(values):.1f}, max {max(values):.1f}){cpu}")


if __name__ == "__main__":
    main()
