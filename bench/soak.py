"""Soak: the real `vllm-sentinel run` daemon scraping 16 loopback targets at 1 s for an hour, with incidents.

The targets serve the real vLLM capture with advancing counters, from a process of their own (so
their cost is not the daemon's): most are healthy, some preempt every second (kv_cache_pressure
fires after the rule's `for`), some hold running requests with frozen token counters (engine_stall
fires, which asks for a stack capture). Bodies come from a template split once at start and are
cached per (kind, second), so serving costs a string join per second per kind.

Every --every seconds it reads the daemon's CPU (utime+stime+cutime+cstime of /proc/PID/stat), RSS and peak RSS
(/proc/PID/status), open fds (/proc/PID/fd), threads, and from the daemon's own /metrics the samples
stored and incidents active, and prints a row (flushed); at the end a summary: CPU % of one core,
RSS start/peak/end, fds and threads min/max, and whether each is flat or growing. Asserts nothing.

    .venv/bin/python bench/soak.py [--duration 3600] [--targets 16] [--every 60] [--interval 1s]

Everything is loopback and bounded: the daemon runs with `--duration`, the target process exits when
its lifetime ends or its parent is gone, and both are stopped and the temporary folder removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "collectors" / "fixtures" / "vllm-0.32.0-cpu-one-request.prom.txt"
COUNTER = re.compile(r"^(\S+?)(_total|_count|_sum|_bucket)(\{.*\})? (\S+)$")
# per second: healthy targets serve one request's worth; preempting ones also preempt once a second;
# stalled ones hold requests with every counter frozen
KINDS = ("healthy", "preempting", "stalled")


class Template:
    """The capture split once into fixed text and counter slots, rendered for a given second."""

    def __init__(self, text: str, kind: str):
        self.parts: list[tuple[str, float, float]] = []  # (text before the value, base, step per second)
        fixed: list[str] = []
        for line in text.splitlines():
            m = COUNTER.match(line)
            gauge = line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting{"))
            if line.startswith("#") or not (m or gauge):
                fixed.append(line)
                continue
            head, value = line.rsplit(" ", 1)
            base, step = float(value), 0.0 if kind == "stalled" else 1.0
            if gauge:
                base, step = (3.0 if kind == "stalled" else 1.0), 0.0
            elif "num_preemptions" in head:
                step = 1.0 if kind == "preempting" else 0.0
            self.parts.append(("\n".join(fixed + [head + " "]), base, step))
            fixed = []
        self.tail = "\n".join(fixed) + "\n"

    def render(self, second: int) -> bytes:
        """The body at `second` seconds after start: every counter advanced by its step times that."""
        return ("".join(f"{text}{base + step * second!r}\n" for text, base, step in self.parts) + self.tail).encode()


def serve(n: int, lifetime_s: float, only: str | None = None) -> None:
    """Serve n targets on loopback, print their ports as one JSON line, exit after lifetime_s or with the parent.

    `only` gives every target that kind (bench/vs_prometheus.py: all healthy), else kind_of's mix.
    """
    text = CAPTURE.read_text()
    templates = {k: Template(text, k) for k in KINDS}
    cache: dict[tuple[str, int], bytes] = {}
    lock = threading.Lock()
    t0 = time.monotonic()

    def body(kind: str) -> bytes:
        second = int(time.monotonic() - t0)
        with lock:
            if (kind, second) not in cache:
                for key in [k for k in cache if k[1] < second - 1]:
                    del cache[key]  # bounded: only the current second's bodies are kept
                cache[(kind, second)] = templates[kind].render(second)
            return cache[(kind, second)]

    servers = []
    for i in range(n):
        kind = only or kind_of(i, n)

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # connections kept alive between scrapes, as uvicorn under vLLM keeps them

            def setup(self) -> None:
                super().setup()
                # as uvicorn (asyncio sets it on every TCP transport): without it the body's last segment
                # waits for the client's delayed ACK, 40 ms per scrape on a kept connection
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self, kind: str = kind) -> None:  # noqa: N802
                data = body(kind)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, *a: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    print(json.dumps([s.server_address[1] for s in servers]), flush=True)
    parent = os.getppid()
    while time.monotonic() - t0 < lifetime_s and os.getppid() == parent:
        time.sleep(1)
    for s in servers:
        s.shutdown()
        s.server_close()


def kind_of(i: int, n: int) -> str:
    """Target i of n: the last two stalled, the two before preempting, the rest healthy."""
    return "stalled" if i >= n - 2 else "preempting" if i >= n - 4 else "healthy"


def proc_figures(pid: int) -> dict:
    """The daemon's CPU seconds (its own and its reaped children's: report charts, py-spy), RSS and peak
    RSS (MiB), open fds and threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"cpu_s": (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick,
            "rss_mib": int(status["VmRSS"].split()[0]) / 1024, "hwm_mib": int(status["VmHWM"].split()[0]) / 1024,
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(status["Threads"])}


def own_metrics(port: int) -> dict:
    """Samples stored, incidents active and deferred work from the daemon's own /metrics (empty if it does not answer)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    got = {"samples": 0.0, "incidents": 0.0, "deferred": 0.0, "interval": 0.0}
    for line in text.splitlines():
        if line.startswith("vllm_sentinel_samples_stored_total"):
            got["samples"] = float(line.split()[-1])
        elif line.startswith("vllm_sentinel_incidents_active{"):
            got["incidents"] += float(line.split()[-1])
        elif line.startswith("vllm_sentinel_deferred_total{"):
            got["deferred"] += float(line.split()[-1])
        elif line.startswith("vllm_sentinel_effective_interval_seconds"):
            got["interval"] = float(line.split()[-1])
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trend(values: list[float]) -> str:
    """'flat' unless the last quarter's mean is above the second quarter's by more than 10 % (warm-up excluded)."""
    if len(values) < 8:
        return "too short to tell"
    q = len(values) // 4
    early, late = sum(values[q:2 * q]) / q, sum(values[-q:]) / q
    return f"growing ({early:.1f} -> {late:.1f})" if late > early * 1.10 + 1 else f"flat ({early:.1f} -> {late:.1f})"


def soak(args: argparse.Namespace) -> None:
    """Start the targets and the daemon, sample until the duration ends, print rows and a summary."""
    tmp = Path(tempfile.mkdtemp(prefix="vllm-sentinel-soak-"))
    servers = daemon = None
    rows: list[dict] = []
    try:
        servers = subprocess.Popen([sys.executable, __file__, "--serve", str(args.targets),
                                    "--lifetime", str(args.duration + 300)], stdout=subprocess.PIPE, text=True)
        ports = json.loads(servers.stdout.readline())
        port = free_port()
        cmd = [sys.executable, "-m", "vllm_sentinel", "run", "--db", str(tmp / "soak.duckdb"), "--interval",
               args.interval, "--metrics-port", str(port), "--nvml", "off", "--duration", f"{args.duration + 60}s",
               *args.daemon_arg]
        for p in ports:
            cmd += ["--target", f"http://127.0.0.1:{p}"]
        # a session of its own, as a daemon runs (autogroup scheduling would otherwise tie it to ours)
        daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.log", "w"),
                                  start_new_session=True)
        kinds = [kind_of(i, args.targets) for i in range(args.targets)]
        print(f"soak: {args.targets} targets ({', '.join(f'{kinds.count(k)} {k}' for k in KINDS)}) every "
              f"{args.interval}, {args.duration:g} s, daemon pid {daemon.pid}, own metrics :{port}", flush=True)
        print(f"{'t_s':>6} {'cpu%':>6} {'cpu%cum':>7} {'rss_MiB':>8} {'peak_MiB':>8} {'fds':>4} {'thr':>4} "
              f"{'samples':>10} {'incid':>5} {'defer':>5} {'intv_s':>6}", flush=True)
        t0 = time.monotonic()
        first = last = proc_figures(daemon.pid)
        t_last = t0
        while time.monotonic() - t0 < args.duration and daemon.poll() is None:
            time.sleep(min(args.every, max(0.0, args.duration - (time.monotonic() - t0))))
            if daemon.poll() is not None:
                break
            now, fig = time.monotonic(), proc_figures(daemon.pid)
            row = {**fig, "t": now - t0, **own_metrics(port),
                   "cpu_pct": 100 * (fig["cpu_s"] - last["cpu_s"]) / max(now - t_last, 1e-9),
                   "cpu_cum": 100 * (fig["cpu_s"] - first["cpu_s"]) / max(now - t0, 1e-9)}
            rows.append(row)
            last, t_last = fig, now
            print(f"{row['t']:6.0f} {row['cpu_pct']:6.1f} {row['cpu_cum']:7.1f} {row['rss_mib']:8.1f} "
                  f"{row['hwm_mib']:8.1f} {row['fds']:4d} {row['threads']:4d} {row.get('samples', 0):10.0f} "
                  f"{row.get('incidents', 0):5.0f} {row.get('deferred', 0):5.0f} {row.get('interval', 0):6.1f}",
                  flush=True)
        summarize(rows, daemon, tmp)
    finally:
        for p in (daemon, servers):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(rows: list[dict], daemon: subprocess.Popen, tmp: Path) -> None:
    """The summary lines: CPU, RSS start/peak/end, fds and threads range and trend, reports written."""
    if daemon.poll() is not None:
        print(f"daemon exited early with {daemon.returncode}: {(tmp / 'daemon.log').read_text()[-2000:]}", flush=True)
    if not rows:
        print("no rows sampled", flush=True)
        return
    reports = list((tmp / "soak.duckdb.reports").glob("*/*.md"))
    col = lambda k: [r[k] for r in rows]  # noqa: E731
    print(f"\nsummary over {rows[-1]['t']:.0f} s ({len(rows)} rows):", flush=True)
    print(f"  daemon CPU: {rows[-1]['cpu_cum']:.1f} % of one core on average "
          f"(rows min {min(col('cpu_pct')):.1f} %, max {max(col('cpu_pct')):.1f} %)")
    print(f"  RSS MiB: start {rows[0]['rss_mib']:.1f}, peak {rows[-1]['hwm_mib']:.1f}, end {rows[-1]['rss_mib']:.1f}; "
          f"{trend(col('rss_mib'))}")
    print(f"  open fds: min {min(col('fds'))}, max {max(col('fds'))}; {trend(col('fds'))}")
    print(f"  threads: min {min(col('threads'))}, max {max(col('threads'))}; {trend(col('threads'))}")
    print(f"  samples stored {rows[-1].get('samples', 0):.0f}, incidents active at the end "
          f"{rows[-1].get('incidents', 0):.0f}, reports written {len(reports)}, "
          f"deferred work {rows[-1].get('deferred', 0):.0f}", flush=True)
    archived = sorted((tmp / "soak.duckdb.hours").glob("*.parquet"))
    if archived:  # the closed hours the daemon archived while the soak ran
        import duckdb

        files = ", ".join("'" + str(f).replace("'", "''") + "'" for f in archived)
        rows_in = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet([{files}])").fetchone()[0]
        size = sum(f.stat().st_size for f in archived)
        print(f"  closed hours archived: {len(archived)} file(s), {rows_in:,} samples, {size / 2**20:.1f} MiB, "
              f"{size / max(rows_in, 1):.2f} B/sample", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds to run (3600; 120 for a quick look)")
    ap.add_argument("--targets", type=int, default=16)
    ap.add_argument("--every", type=float, default=None, help="seconds between rows (default: duration/40, 5..60)")
    ap.add_argument("--interval", default="1s", help="the daemon's --interval")
    ap.add_argument("--daemon-arg", action="append", default=[], help="extra argument for `run` (repeatable)")
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # the target process
    ap.add_argument("--lifetime", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--kind", choices=KINDS, default=None, help=argparse.SUPPRESS)  # every target this kind
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.lifetime, args.kind)
        return
    if args.every is None:
        args.every = min(60.0, max(5.0, args.duration / 40))
    soak(args)


if __name__ == "__main__":
    main()
