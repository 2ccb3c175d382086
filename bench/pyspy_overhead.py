"""Serving throughput of a real vLLM CPU server with py-spy captures running every few seconds vs without.

Starts the tiny model on loopback and runs bounded phases of closed-loop traffic, one mode each:

    baseline  nothing else runs
    dump      a capture process (the sidecar's place) runs `py-spy dump` of every vLLM process every N s
    record    the same with a short `py-spy record` instead
    control   the same process starts, every N s, a child that only burns as much CPU as a py-spy
              capture did (no py-spy, no ptrace, no reads of vLLM's memory)
    daemon    the real sidecar, `vllm-sentinel run --interval 1s` in a session of its own, started and
              answering before the traffic (its start-up is not counted); it captures stacks only if
              an incident opens, as in production

The control separates what py-spy costs from what *any* short-lived process costs on the machine.
On the 2-vCPU VM this was written on, vLLM's CPU backend keeps both vCPUs busy (the worker bound to
one, the engine core busy-waiting with sched_yield on the other), and a new process there can wait
seconds for a CPU (`python3 -S -c pass`: 62 ms idle, up to 11 s under load). With the kernel's
autogroup scheduling (kernel.sched_autogroup_enabled=1) whatever shares that process's session
waits too: run from the load generator's session, a 44 ms CPU burn every 3 s cost 40-60 % of
throughput. So the capture loop runs in a session of its own, as a sidecar daemon does, and the
load generator in the bench's. Phases are separated by idle time (--settle-s) so each starts in
the same state; modes rotate so drift hits all alike; each mode's median is compared with the
baseline's and with the control's. Each event's wall time is printed: a starved capture loop
captures less often than --every-s asks. Prints figures; asserts nothing.

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
import tempfile
import time
from pathlib import Path

from vllm_sentinel.agent.daemon import client as api
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.demo.tiny_model import build_tiny_model
from vllm_sentinel.agent.demo.traffic import TrafficPlan, run_traffic
from vllm_sentinel.agent.demo.vllm_server import VllmServer, VllmServerConfig
from vllm_sentinel.collectors import pyspy as ps
from vllm_sentinel.collectors.process import discover, parent_map

MODES = ("baseline", "dump", "record", "control", "daemon")
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
            # in the loop's own session, unlike py-spy (collectors/pyspy gives it one): the control
            # shows what a child that waits for a CPU inside its caller's session costs
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


def _cpu_ms(pid: int) -> int:
    """User+system CPU of a process and its reaped children, in ms (from /proc/<pid>/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(1000 * sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK"))


def daemon_phase(server: VllmServer, seconds: float) -> tuple[float, dict]:
    """One traffic phase with the real sidecar daemon scraping every second; its CPU and scrape gaps."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        daemon = subprocess.Popen([sys.executable, "-m", "vllm_sentinel", "run", "--target", server.url, "--db", str(db),
                                   "--interval", "1s", "--metrics-port", "0"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while True:  # answering and scraping before the traffic starts
                try:
                    if any(c["last_ms"] for c in api.call(socket_path_for(db), "/v1/status", timeout=2)["collectors"]):
                        break
                except api.ApiError:
                    pass
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon did not start: {daemon.stderr.read() if daemon.stderr else ''}")
                time.sleep(0.3)
            cpu0, t0 = _cpu_ms(daemon.pid), int(time.time() * 1000)
            plan = TrafficPlan(requests=100_000, duration_s=seconds, concurrency=4, prompt_tokens=64, max_tokens=32)
            result = run_traffic(server.url, server.model_name, plan)
            cpu1, t1 = _cpu_ms(daemon.pid), int(time.time() * 1000)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
        with Store.open(db, read_only=True) as store:
            ts = [r[0] for r in store.con.execute(
                "SELECT ts FROM samples JOIN series USING (series_id) WHERE metric = 'up' AND instance = ? "
                "AND ts BETWEEN ? AND ? ORDER BY ts", [server.instance, t0, t1]).fetchall()]
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    return result.completion_tokens / result.elapsed_s, {
        "elapsed_ms": int(1000 * result.elapsed_s), "events": len(ts), "failed": 0, "child_cpu_ms": cpu1 - cpu0,
        "wall_ms": gaps}


def phase(server: VllmServer, mode: str, seconds: float, every_s: float, record_s: int,
          burn_ms: float) -> tuple[float, dict]:
    """Output tokens per second over one bounded traffic phase in `mode`, and the capture loop's tallies."""
    if mode == "daemon":
        return daemon_phase(server, seconds)
    loop = None
    if mode != "baseline":
        # a separate process in a session of its own, as the sidecar daemon is: it never shares the
        # load generator's GIL nor, with the kernel's autogroup scheduling, its session's CPU share
        loop = subprocess.Popen([sys.executable, __file__, "--capture-loop", server.url, mode, str(every_s),
                                 str(record_s), str(burn_ms)], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
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


def pin_server(root_pid: int, cpus: set[int]) -> int:
    """Pin every thread of the server's process tree to `cpus` and this process to the others; returns threads pinned.

    The layout of a GPU host, where serving leaves CPUs free: vLLM keeps its cores, the load
    generator and the capture loop (started after this, so it inherits) get the rest.
    """
    parents = parent_map()
    tree, grew = {root_pid}, True
    while grew:
        kids = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= kids
        grew = bool(kids)
    pinned = 0
    for pid in tree:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
                pinned += 1
            except OSError:  # a thread that ended meanwhile
                pass
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - cpus)
    return pinned


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
    ap.add_argument("--server-cpus", default="", help="pin vLLM to these CPUs (e.g. 0) and the rest to the others")
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

    server_cpus = {int(c) for c in args.server_cpus.split(",") if c.strip()}
    # with pinned CPUs vLLM's own OpenMP binding must stay inside them
    env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(server_cpus)))} if server_cpus else {}
    server = VllmServer(VllmServerConfig(model_dir=build_tiny_model(), max_num_seqs=8, max_model_len=512,
                                         extra_env=env), startup_timeout_s=900)  # a busy 2-core machine can take minutes
    t0 = time.monotonic()
    server.start()
    ncpu = os.cpu_count() or 1
    if server_cpus:
        print(f"vLLM pinned to CPUs {sorted(server_cpus)} ({pin_server(server.pid or 0, server_cpus)} threads); "
              f"load generator and captures on {sorted(os.sched_getaffinity(0))}")
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
                    # for the daemon an event is a scrape, its CPU is the daemon's, and "gap" is between scrapes
                    what = "gap between scrapes" if mode == "daemon" else "wall"
                    extra = (f"  events={counts['events']} failed={counts['failed']} CPU {cpu / events:.0f} ms/event "
                             f"({100 * cpu / counts['elapsed_ms'] / ncpu:.2f} % of the machine), {what} median "
                             f"{statistics.median(walls)} ms max {max(walls)} ms")
                print(f"round {rnd + 1} {mode:8s} {tps:8.1f} output tokens/s{extra}", flush=True)
    finally:
        server.stop()
    for err in sorted(errors):
        print("capture error:", err)
    # each phase against the baseline of its own round: a server that drifts over the run (the
    # pinned layout slows down by a third in ten minutes) would otherwise pass for overhead
    paired = {m: [100 * (v - b) / b for v, b in zip(vals, results["baseline"])] for m, vals in results.items()}
    print(f"\nmode     median tok/s  vs baseline (paired by round)  vs control   (phases of {args.phase_s:.0f} s after "
          f"{args.settle_s:.0f} s idle, an event every {args.every_s:.0f} s, record {args.record_s} s, {args.rounds} rounds)")
    for mode, values in results.items():
        med = statistics.median(values)
        rel = paired[mode]
        vs_control = ""
        if "control" in paired and mode not in ("baseline", "control"):
            vs_control = f"{statistics.median(paired[mode]) - statistics.median(paired['control']):+9.1f} pts"
        cpu = (f"   {statistics.mean(cpu_per_event[mode]):.0f} ms CPU/event" if mode in cpu_per_event else "")
        # mean of the paired differences with about a 95 % interval (2 standard errors): one phase
        # varies by ~10 % here, so a few rounds cannot tell 2 % from 0
        spread = f" mean {statistics.mean(rel):+.1f} ± {2 * statistics.stdev(rel) / len(rel) ** 0.5:.1f}" if len(rel) > 1 else ""
        print(f"{mode:8s} {med:11.1f}   {statistics.median(rel):+8.1f} % (range {min(rel):+.1f} .. {max(rel):+.1f};{spread})"
              f"  {vs_control:>13s}{cpu}")


if __name__ == "__main__":
    main()
