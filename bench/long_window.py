"""Benchmark: a long window diagnosed over a fleet, with and without the store's five-minute rollups.

Data: bench/promql.py's vLLM-shaped history (about 500 series per instance at 1 s), loaded through
Store.append_many and archived by the hourly rewrite. Then, each in a fresh process:

* rolling the history up (what the daemon does a block at a time, every 5 minutes);
* the health summary over the whole window, from samples only and from rollups;
* `diagnose --since <hours>h --reuse-live --format json` with the window marked as evaluated live by
  the daemon (so no rule is replayed: what is left is what rollups serve), rollups hidden, then used.

Prints figures (wall, CPU, peak RSS); asserts nothing.

    python bench/long_window.py                    # 16 instances x 6 h
    python bench/long_window.py --hours 24         # a day (loading takes about 6 minutes)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_promql", Path(__file__).with_name("promql.py"))
bench_promql = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_promql)


def roll(db: str) -> dict:
    """Roll every complete block up, a round (an hour) at a time; wall, CPU, blocks, peak RSS."""
    from vllm_sentinel.agent.store import rollups
    from vllm_sentinel.agent.store.db import Store

    t, cpu = time.perf_counter(), time.process_time()
    with Store.open(db) as store:
        end = store.time_range()[1]
        blocks = rollups.roll_up_all(store, end + 1)
        rows = store.cursor().execute("SELECT count(*) FROM rollups").fetchone()[0]
    return {"wall_s": round(time.perf_counter() - t, 1), "cpu_s": round(time.process_time() - cpu, 1),
            "blocks": blocks, "rows": rows, "peak_rss_mib": _peak()}


def summary(db: str, start: int, end: int, use_rollups: bool) -> dict:
    """The health summary over [start, end] in this process; wall, CPU, peak RSS, the signals."""
    from vllm_sentinel.agent.diagnosis.summary import health_summary
    from vllm_sentinel.agent.promql.engine import Engine
    from vllm_sentinel.agent.store.db import Store

    with Store.open(db, read_only=True) as store:
        engine = Engine(store, rollups=use_rollups)
        t, cpu = time.perf_counter(), time.process_time()
        out = [s.as_dict() for s in health_summary(store, start, end, None, engine)]
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mib": _peak(),
            "used": engine.rollups_used, "signals": [s["signals"] for s in out]}


def _peak() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _diagnose(db: str, hours: float, until_s: float) -> tuple[float, int, str]:
    """`diagnose --reuse-live` as an operator runs it: wall seconds, peak RSS (MiB) and the summary's source."""
    cmd = [sys.executable, "-m", "vllm_sentinel", "diagnose", "--db", db, "--since", f"{int(hours * 3600)}s",
           "--until", str(until_s), "--format", "json", "--reuse-live"]
    with tempfile.TemporaryFile("w+") as out:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS, not the largest of all children
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise SystemExit(f"diagnose exited {proc.returncode}")
        out.seek(0)
        doc = json.load(out)
    return wall, round(usage.ru_maxrss / 1024), f"{doc['summary_source']}, replayed {doc['evaluation']['replayed']}"


def _mark_evaluated(db: str, start: int, end: int, watermark: int | None) -> int:
    """Mark [start, end] as evaluated live by the shipped pack; set (or read) the rollup watermark."""
    from vllm_sentinel.agent.alerts.rulepack import load_pack
    from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
    from vllm_sentinel.agent.store.db import Store

    with Store.open(db) as store:
        cur = store.cursor()
        cur.execute("DELETE FROM rule_coverage")
        cur.execute("INSERT INTO rule_coverage VALUES (?, ?, ?)",
                    [pack_window_evaluator(load_pack(None)).fingerprint, start - 600_000, end + 600_000])
        if watermark is not None:
            cur.execute("UPDATE rollup_watermark SET until_ms = ?", [watermark])
        return int(cur.execute("SELECT until_ms FROM rollup_watermark").fetchone()[0])


def main() -> None:
    """Load, roll up, then time the summary and diagnose with and without rollups."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--db", help="reuse (or keep) the loaded store at this path")
    ap.add_argument("--_roll", nargs=1, help=argparse.SUPPRESS)
    ap.add_argument("--_summary", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._roll:
        print(json.dumps(roll(args._roll[0])))
        return
    if args._summary:
        db, start, end, use = args._summary
        print(json.dumps(summary(db, int(start), int(end), use == "1")))
        return
    with tempfile.TemporaryDirectory(prefix="long-window-bench-") as tmp:
        db = args.db or str(Path(tmp) / "bench.duckdb")
        if not Path(db).exists():
            loaded = json.loads(subprocess.run(
                [sys.executable, str(Path(__file__).with_name("promql.py")), "--_load", db, str(args.instances),
                 str(args.hours)], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
            print(f"loaded {args.instances} instances x {args.hours} h: {loaded['samples']:,} samples in "
                  f"{loaded['load_s']} s")
        rolled = _child(["--_roll", db])
        print(f"roll-up: {rolled['blocks']} blocks, {rolled['rows']:,} rows, {rolled['wall_s']} s wall, "
              f"{rolled['cpu_s']} s CPU, peak RSS {rolled['peak_rss_mib']} MiB")
        from vllm_sentinel.agent.store.db import Store
        with Store.open(db, read_only=True) as store:
            lo, hi = store.time_range()
        end = hi - 150_000  # not on a block boundary: the window has raw edges at both ends
        start = max(lo, end - int(args.hours * 3_600_000))
        raw = _child(["--_summary", db, str(start), str(end), "0"])
        fast = _child(["--_summary", db, str(start), str(end), "1"])
        same = raw["signals"] == fast["signals"]
        print(f"health summary, {(end - start) / 3.6e6:.2f} h x {args.instances}: samples {raw['wall_s']} s wall "
              f"({raw['cpu_s']} s CPU, {raw['peak_rss_mib']} MiB); rollups {fast['wall_s']} s wall "
              f"({fast['cpu_s']} s CPU, {fast['peak_rss_mib']} MiB, used: {fast['used']}); identical signals: {same}")
        if not same:
            for a, b in zip(raw["signals"], fast["signals"]):
                diff = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
                if diff:
                    print("    differs:", diff)
                    break
        watermark = _mark_evaluated(db, start, end, None)
        for label, mark in (("rollups hidden", 0), ("rollups", watermark)):
            _mark_evaluated(db, start, end, mark)
            wall, peak, source = _diagnose(db, args.hours, end / 1000)
            print(f"diagnose --since {args.hours}h --reuse-live (window evaluated live), {label}: {wall:.2f} s wall, "
                  f"peak RSS {peak} MiB ({source})")


if __name__ == "__main__":
    main()
