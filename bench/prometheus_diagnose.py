"""How long `diagnose --prometheus --since 1h` takes, and its peak memory, against a real Prometheus 2.42.

Two datasets, each loaded into Prometheus with `promtool tsdb create-blocks-from openmetrics` and
into DuckDB with `vllm-sentinel ingest` (the same samples on both sides):

* a fleet: N instances x 1 h generated from a real vLLM capture (bench/fleet_data.py);
* the recorded real session (reports/recordings/cpu-tiny-llama.prom.gz, 8 minutes of one server).

For each, `vllm-sentinel diagnose` runs as a child process (what an operator types), --prometheus
and --db, `--repeat` times: wall seconds (median, min, max) and the child's peak RSS; then the
incidents of both sources are compared. Prints figures, asserts nothing. Run it alone on the machine
(`flock /work/heavy.lock`): it measures time.

    .venv/bin/python bench/prometheus_diagnose.py --instances 16 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fleet_data import generate  # noqa: E402
from vllm_sentinel.agent.demo.prometheus_server import PrometheusServer, backfill, write_openmetrics  # noqa: E402
from vllm_sentinel.agent.demo.replay import default_recording  # noqa: E402
from vllm_sentinel.collectors.timefmt import iso_seconds  # noqa: E402

END_MS = 1_796_000_000_000


def run_child(args: list[str]) -> tuple[float, int, str]:
    """(wall s, peak RSS in MiB, stdout) of one `vllm-sentinel` child process (its own rusage, by wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "vllm_sentinel", *args], stdout=out, stderr=err, text=True)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"vllm-sentinel {' '.join(args)} failed: {err.read().strip()[-400:]}")
        return wall, usage.ru_maxrss // 1024, out.read()  # ru_maxrss: KiB on Linux


def timed(label: str, args: list[str], repeat: int) -> dict:
    walls, peaks, out = [], [], ""
    for _ in range(repeat):
        wall, peak, out = run_child(args)
        walls.append(wall)
        peaks.append(peak)
    doc = json.loads(out)
    print(f"  {label:<34} {statistics.median(walls):6.2f} s median ({min(walls):.2f}-{max(walls):.2f}, n={repeat}),"
          f" peak RSS {max(peaks)} MiB, {len(doc['incidents'])} incidents,"
          f" {len(doc['instances'])} instances")
    return doc


def compare(db: dict, prom: dict) -> None:
    key = lambda i: (i["incident"], i["instance"], i["start"], i["end"])  # noqa: E731
    a, b = {key(i) for i in db["incidents"]}, {key(i) for i in prom["incidents"]}
    fixes_a = {i["id"]: [(f["param"], f["current"], f["suggested"]) for f in i["fixes"]] for i in db["incidents"]}
    fixes_b = {i["id"]: [(f["param"], f["current"], f["suggested"]) for f in i["fixes"]] for i in prom["incidents"]}
    same_fix = sum(fixes_a[k] == fixes_b.get(k) for k in fixes_a)
    print(f"  agreement: {len(a & b)} incidents in both, {len(a - b)} only --db, {len(b - a)} only --prometheus; "
          f"fixes equal for {same_fix} of {len(fixes_a)}")


def prometheus_rss_mib(prom: PrometheusServer) -> int:
    """Prometheus' own peak RSS (VmHWM) so far."""
    for line in Path(f"/proc/{prom.proc.pid}/status").read_text().splitlines():  # type: ignore[union-attr]
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return -1


def dataset(name: str, dump: Path, tmp: Path, since: str, until_ms: int, repeat: int) -> None:
    print(f"{name}:")
    t0 = time.perf_counter()
    om = write_openmetrics(dump, tmp / f"{name}.om")
    backfill(om, tmp / name / "tsdb")
    print(f"  backfill (OpenMetrics + promtool)  {time.perf_counter() - t0:6.1f} s")
    db = tmp / f"{name}.duckdb"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "vllm_sentinel", "ingest", str(dump), "--db", str(db)], check=True,
                   capture_output=True)
    print(f"  ingest into DuckDB                 {time.perf_counter() - t0:6.1f} s")
    window = ["--since", since, "--until", iso_seconds(until_ms), "--format", "json"]
    with PrometheusServer(tmp / name) as prom:
        remote = timed("diagnose --prometheus", ["diagnose", "--prometheus", prom.url, *window], repeat)
        timed("diagnose --prometheus --selector", ["diagnose", "--prometheus", prom.url, "--selector",
                                                    '{instance=~".+"}', *window], repeat)
        print(f"  Prometheus peak RSS                {prometheus_rss_mib(prom)} MiB")
    local = timed("diagnose --db", ["diagnose", "--db", str(db), *window], repeat)
    compare(local, remote)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--interval", type=int, default=15, help="scrape interval of the generated fleet, seconds")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="vllm-sentinel-bench-prom-") as t:
        tmp = Path(t)
        dump = tmp / "fleet.prom"
        t0 = time.perf_counter()
        n = generate(dump, a.instances, END_MS - 3_600_000, 3600, a.interval)
        print(f"generated {n:,} samples: {a.instances} instances x 1 h every {a.interval} s "
              f"({dump.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
        dataset(f"fleet-{a.instances}", dump, tmp, "1h", END_MS, a.repeat)
        meta = json.loads(default_recording().with_name("cpu-tiny-llama.json").read_text())
        dataset("recorded-session", default_recording(), tmp, "1h", -(-meta["end_ms"] // 1000) * 1000, a.repeat)


if __name__ == "__main__":
    main()
