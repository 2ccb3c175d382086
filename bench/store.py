"""Store figures: parse+store CPU per tick for 16 targets, ingest samples/s, bytes per sample once sorted.

Prints figures; asserts nothing. Usage: python bench/store.py [--minutes 10]
Payloads are the real vLLM 0.32 capture (DP=2 render, 861 samples) with counters advancing per tick.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from vllm_sentinel.agent.store.db import HOUR_MS, Store
from vllm_sentinel.collectors.aliases import resolve
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.collectors.exposition import parse

FIXTURES = Path(__file__).parents[1] / "tests" / "collectors" / "fixtures"
PAYLOAD = FIXTURES / "vllm-0.32.0-dp2-rendered.prom.txt"


def advancing_payloads(text: str, ticks: int, seed: int = 1) -> list[str]:
    """The same exposition at successive ticks: counter-like samples grow, gauges wander a little."""
    rnd = random.Random(seed)
    lines = text.splitlines()
    out = []
    state = {}
    for tick in range(ticks):
        rendered = []
        for i, line in enumerate(lines):
            if line.startswith("#") or not line.strip():
                rendered.append(line)
                continue
            head, _, value = line.rpartition(" ")
            v = state.get(i, float(value))
            if head.split("{")[0].endswith(("_total", "_bucket", "_count", "_sum")):
                v += rnd.choice((0, 0, 0, 1, 2, 5))
            elif rnd.random() < 0.1:
                v = max(0.0, v + rnd.choice((-1, 1)))
            state[i] = v
            rendered.append(f"{head} {v!r}")
        out.append("\n".join(rendered) + "\n")
    return out


def tick_batches(payload: str, ts: int, targets: int, shapes: dict | None = None) -> list[Batch]:
    """One tick's batches; with `shapes` (a dict kept across ticks) each body is read as the collector reads it,
    by the shape of the last one."""
    parsed = parse(payload, strict=False, shape=None if shapes is None else shapes.get("last"),
                   keep_shape=shapes is not None)
    if shapes is not None:
        shapes["last"] = parsed.shape
    names, renames = resolve(parsed.names)
    batches = []
    for t in range(targets):
        b = Batch(instance=f"10.0.0.{t}:8000", ts_ms=ts)
        b.metrics, b.labels, b.values, b.timestamps_ms = names, parsed.labels, parsed.values, parsed.timestamps_ms
        batches.append(b)
    return batches


def fresh_copy_size(path: Path, partitions: list[str], fresh: Path) -> int:
    """Bytes of a new DuckDB file holding only these partitions and the series table.

    DuckDB never shrinks a file in place, so a rewritten partition's real size is read from a copy.
    """
    import duckdb

    con = duckdb.connect(str(fresh))
    con.execute(f"ATTACH '{path}' AS src (READ_ONLY)")
    for name in partitions:
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM src.{name}")
    con.execute("CREATE TABLE series AS SELECT * FROM src.series")
    con.execute("DETACH src")
    con.execute("CHECKPOINT")
    con.close()
    return os.path.getsize(fresh)


def archive_size(path: Path) -> int:
    """Bytes of the closed hours' Parquet files beside the store file."""
    folder = path.parent / (path.name + ".hours")
    return sum(f.stat().st_size for f in folder.glob("*.parquet")) if folder.is_dir() else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=int, default=10, help="minutes of 1 Hz data for 16 targets")
    ap.add_argument("--targets", type=int, default=16)
    a = ap.parse_args()
    text = PAYLOAD.read_text()
    distinct = advancing_payloads(text, 60)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.duckdb"
        store = Store.open(path)
        t0 = (1_795_000_000_000 // HOUR_MS) * HOUR_MS
        ticks = a.minutes * 60
        cpu_ticks, wall_ticks, samples = [], [], 0
        shapes: list[dict] = [{} for _ in range(a.targets)]  # per target, as each collector keeps its own
        for tick in range(ticks):
            payload = distinct[tick % len(distinct)]
            c0, w0 = time.process_time(), time.perf_counter()
            # one real tick: parse each target's payload, then one transaction for all of them
            batches = []
            for t in range(a.targets):
                batches.extend(tick_batches(payload, t0 + tick * 1000, 1, shapes[t]))
                batches[-1].instance = f"10.0.0.{t}:8000"
            samples += store.append_many(batches)
            cpu_ticks.append(time.process_time() - c0)
            wall_ticks.append(time.perf_counter() - w0)
        cpu_ticks.sort()
        wall_ticks.sort()
        total_wall = sum(wall_ticks)
        per_tick = samples // ticks
        print(f"targets={a.targets} samples/tick={per_tick} ticks={ticks} (1 Hz, {a.minutes} min)")
        print(f"parse+store CPU per tick: p50 {cpu_ticks[len(cpu_ticks)//2]*1000:.1f} ms, "
              f"p99 {cpu_ticks[int(len(cpu_ticks)*0.99)]*1000:.1f} ms "
              f"= {cpu_ticks[len(cpu_ticks)//2]*100:.1f}% of a core at 1 Hz")
        print(f"parse+store wall per tick: p50 {wall_ticks[len(wall_ticks)//2]*1000:.1f} ms, "
              f"p99 {wall_ticks[int(len(wall_ticks)*0.99)]*1000:.1f} ms")
        print(f"ingest throughput (parse+store): {samples/total_wall:,.0f} samples/s")
        store.con.execute("CHECKPOINT")
        before = os.path.getsize(path)
        t1 = time.perf_counter()
        sorted_parts = store.sort_closed(t0 + 2 * HOUR_MS)
        took = time.perf_counter() - t1
        store.close()
        after = os.path.getsize(path)
        print(f"file before sorting: {before/samples:.2f} B/sample ({before/2**20:.1f} MiB for {samples:,} samples)")
        fresh = fresh_copy_size(path, sorted_parts, Path(d) / "sorted-copy.duckdb")
        parquet = archive_size(path)
        print(f"closed hour archived sorted by (series_id, ts) in {took:.1f} s: {parquet/samples:.2f} B/sample in "
              f"Parquet, {(parquet + fresh)/samples:.2f} B/sample with the series table in a fresh DuckDB file "
              f"(in-place file {after/2**20:.1f} MiB: DuckDB reuses, never shrinks)")


if __name__ == "__main__":
    sys.exit(main())
