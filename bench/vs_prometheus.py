"""Side by side: `vllm-sentinel run` and a real Prometheus 2.42 scraping the same loopback targets.

N targets (default 16) serve the real vLLM capture with advancing counters from a process of their
own (bench/soak.py's precomputed bodies: a string join per second, so they cost little and neither
contender pays for them). Then, each alone on the machine in turn, for --duration seconds after a
--warmup:

* Prometheus 2.42 (the Debian package) scraping every target each --interval and evaluating the
  exported rule pack (`vllm-sentinel rules export`) every 5 s;
* `vllm-sentinel run` scraping the same targets at the same interval (its process collectors and
  its rule pack every 5 s included), with --cpu-budget 100% so it never stretches its interval.

Measured for each: CPU (utime+stime from /proc, the process and its children, reaped ones too)
per scrape of one target, scrapes from its own counters, peak RSS (VmHWM), and bytes on disk per
sample once compacted: Prometheus's head cut to a block by a TSDB snapshot (admin API), the
sidecar's partitions forced through its hourly rewrite (sorted zstd Parquet files beside the store),
plus the rest of the store copied to a fresh file (DuckDB never shrinks a file in place). Prints a table and the ratios; asserts nothing.

    .venv/bin/python bench/vs_prometheus.py [--targets 16] [--duration 120] [--warmup 15] [--interval 1s]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


from vllm_sentinel.agent.demo.prometheus_server import PrometheusServer
from vllm_sentinel.agent.store.db import HOUR_MS, Store
from vllm_sentinel.collectors.base import now_ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import free_port  # noqa: E402  (bench/ is a folder of scripts, not a package)
from store import archive_size, fresh_copy_size  # noqa: E402

SOAK = Path(__file__).resolve().parent / "soak.py"
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """utime+stime of pid, its live descendants, and its children already reaped (cutime+cstime)."""
    total, stack, first = 0.0, [pid], True
    while stack:
        p = stack.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        if first:  # reaped children count once, through the root (their own descendants are in there)
            total += int(fields[13]) + int(fields[14])
            first = False
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            children = []
        stack.extend(int(c) for c in children)
    return total / TICK


def peak_rss_mib(pid: int) -> float:
    """VmHWM of the process (MiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric_sum(url: str, name: str, where: str = "") -> float:
    """Sum of the samples of `name` (whose label text contains `where`) on a /metrics page."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()  # noqa: S310 - loopback
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {" and where in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def measure(pid: int, scrapes: Callable[[], float], warmup_s: float, duration_s: float) -> dict:
    """CPU seconds and scrapes over duration_s after warmup_s; peak RSS at the end."""
    time.sleep(warmup_s)
    cpu0, n0, t0 = tree_cpu_s(pid), scrapes(), time.monotonic()
    time.sleep(duration_s)
    cpu1, n1, t1 = tree_cpu_s(pid), scrapes(), time.monotonic()
    return {"cpu_s": cpu1 - cpu0, "scrapes": n1 - n0, "wall_s": t1 - t0, "peak_rss_mib": peak_rss_mib(pid)}


def run_prometheus(tmp: Path, ports: list[int], rules: list[Path], args: argparse.Namespace) -> dict:
    """Prometheus alone: measure it, then cut its head to a block (snapshot) and size it."""
    server = PrometheusServer(tmp / "prometheus", targets=[f"127.0.0.1:{p}" for p in ports],
                              scrape_interval=args.interval, scrape_timeout=args.interval, rule_files=rules,
                              extra_flags=["--web.enable-admin-api"])
    with server:
        own = f"{server.url}/metrics"
        got = measure(server.proc.pid, lambda: metric_sum(own, "prometheus_target_interval_length_seconds_count"),
                      args.warmup, args.duration)
        got["rule_evaluations"] = metric_sum(own, "prometheus_rule_evaluations_total")
        got["rule_failures"] = metric_sum(own, "prometheus_rule_evaluation_failures_total")
        req = urllib.request.Request(f"{server.url}/api/v1/admin/tsdb/snapshot", method="POST")
        name = json.loads(urllib.request.urlopen(req, timeout=120).read())["data"]["name"]  # noqa: S310
    snap = tmp / "prometheus" / "tsdb" / "snapshots" / name
    size = sum(f.stat().st_size for f in snap.rglob("*") if f.is_file())
    samples = sum(json.loads(m.read_text())["stats"]["numSamples"] for m in snap.glob("*/meta.json"))
    got.update(disk_bytes=size, disk_samples=samples)
    return got


def run_sidecar(tmp: Path, ports: list[int], args: argparse.Namespace) -> dict:
    """The daemon alone: measure it, stop it, force its sorted rewrite and size the partitions in a fresh file."""
    db, port = tmp / "sidecar.duckdb", free_port()
    cmd = [sys.executable, "-m", "vllm_sentinel", "run", "--db", str(db), "--interval", args.interval,
           "--metrics-port", str(port), "--nvml", "off", "--cpu-budget", "100%",
           "--duration", f"{args.warmup + args.duration + 120:g}s", *args.daemon_arg]
    for p in ports:
        cmd += ["--target", f"http://127.0.0.1:{p}"]
    log = open(tmp / "daemon.log", "w")  # noqa: SIM115 - closed below
    # a session of its own, as a daemon runs (autogroup scheduling would otherwise tie it to ours)
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        own = f"http://127.0.0.1:{port}/metrics"
        wait_answering(own, daemon)
        got = measure(daemon.pid, lambda: metric_sum(own, "vllm_sentinel_scrapes_total", 'target="vllm '),
                      args.warmup, args.duration)
        got["rule_evaluations"] = float("nan")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=120)
        log.close()
    store = Store.open(db)
    try:
        parts = store.sort_closed(now_ms() + 3 * HOUR_MS)  # every partition closed: the hourly rewrite, forced
    finally:
        store.close()
    with Store.open(db, read_only=True) as r:
        samples = r.con.execute("SELECT count(*) FROM samples").fetchone()[0]
    # the closed hours' Parquet files plus the rest of the store (series table) in a fresh file
    got.update(disk_bytes=fresh_copy_size(db, parts, tmp / "sorted-copy.duckdb") + archive_size(db),
               disk_samples=samples)
    return got


def wait_answering(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Until url answers; RuntimeError if the process exits or it takes longer than timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode} before answering {url}")
        try:
            urllib.request.urlopen(url, timeout=2).read()  # noqa: S310 - loopback
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {timeout_s:g} s")


def report(results: dict[str, dict], args: argparse.Namespace) -> None:
    """The table and the ratios."""
    print(f"\n{args.targets} targets every {args.interval}, rules every 5 s, {args.duration:g} s measured each "
          f"after {args.warmup:g} s warm-up, one contender at a time")
    print(f"{'':12} {'scrapes':>8} {'CPU s':>7} {'ms CPU/scrape':>13} {'% of a core':>11} {'peak RSS MiB':>12} "
          f"{'B/sample':>9} {'samples on disk':>15}")
    for name, r in results.items():
        per = 1000 * r["cpu_s"] / max(r["scrapes"], 1)
        print(f"{name:12} {r['scrapes']:8.0f} {r['cpu_s']:7.2f} {per:13.2f} {100 * r['cpu_s'] / r['wall_s']:11.1f} "
              f"{r['peak_rss_mib']:12.1f} {r['disk_bytes'] / max(r['disk_samples'], 1):9.2f} "
              f"{r['disk_samples']:15,.0f}")
    if "prometheus" in results:
        p = results["prometheus"]
        print(f"prometheus rule group evaluations {p['rule_evaluations']:.0f}, failures {p['rule_failures']:.0f}")
    if len(results) == 2:
        s, p = results["sidecar"], results["prometheus"]
        ratio = (s["cpu_s"] / max(s["scrapes"], 1)) / max(p["cpu_s"] / max(p["scrapes"], 1), 1e-12)
        print(f"sidecar / prometheus: CPU per scrape {ratio:.2f}x, "
              f"peak RSS {s['peak_rss_mib'] / p['peak_rss_mib']:.2f}x, bytes per sample {(s['disk_bytes'] / s['disk_samples']) / (p['disk_bytes'] / p['disk_samples']):.2f}x")
    print("CPU seconds per scrape hold on a shared host (other work does not add to a process's own CPU time); "
          "wall-clock figures (scrape count per second, % of a core) do not: the machine may be shared.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=16)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds measured for each contender")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds after start before measuring")
    ap.add_argument("--interval", default="1s", help="scrape interval of both")
    ap.add_argument("--only", choices=("prometheus", "sidecar"), default=None, help="run one contender")
    ap.add_argument("--daemon-arg", action="append", default=[], help="extra argument for `run` (repeatable)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-sentinel-vsprom-"))
    lifetime = 2 * (args.warmup + args.duration) + 600
    servers = subprocess.Popen([sys.executable, str(SOAK), "--serve", str(args.targets), "--lifetime", str(lifetime),
                                "--kind", "healthy"], stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(servers.stdout.readline())
        subprocess.run([sys.executable, "-m", "vllm_sentinel", "rules", "export", "--out", str(tmp / "rules")],
                       check=True, stdout=subprocess.DEVNULL)
        rules = sorted((tmp / "rules").glob("*.yaml"))
        results: dict[str, dict] = {}
        if args.only in (None, "prometheus"):
            results["prometheus"] = run_prometheus(tmp, ports, rules, args)
        if args.only in (None, "sidecar"):
            results["sidecar"] = run_sidecar(tmp, ports, args)
        report(results, args)
    finally:
        servers.send_signal(signal.SIGTERM)
        servers.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
