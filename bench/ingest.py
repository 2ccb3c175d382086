"""`ingest` of a fleet dump with timestamps: samples per second (wall and CPU) and peak RSS.

The dump is bench/fleet_data.py's (a real vLLM 0.32 capture widened to N instances x a window of
15 s scrapes, ms timestamps, one series after another), ingested into a fresh DuckDB file as
`vllm-sentinel ingest` does, then its closed hours archived. Prints figures; asserts nothing.

    .venv/bin/python bench/ingest.py [--instances 16] [--hours 1]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fleet_data import generate  # noqa: E402

from vllm_sentinel.agent.store.db import HOUR_MS, Store  # noqa: E402
from vllm_sentinel.agent.store.ingest import ingest_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--hours", type=int, default=1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        dump = Path(d) / "fleet.prom"
        start_ms = (1_795_996_400_000 // HOUR_MS) * HOUR_MS
        n = generate(dump, a.instances, start_ms, a.hours * 3600, 15)
        print(f"dump: {n:,} samples, {a.instances} instances x {a.hours} h at 15 s, "
              f"{dump.stat().st_size / 2**20:.0f} MiB")
        wall, cpu = time.perf_counter(), time.process_time()
        with Store.open(Path(d) / "i.duckdb") as store:
            got = ingest_file(store, dump)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            archive_s = time.perf_counter()
            store.sort_closed(start_ms + (a.hours + 1) * HOUR_MS)
            archive_s = time.perf_counter() - archive_s
        print(f"ingest: {got.samples:,} samples in {wall:.1f} s wall, {cpu:.1f} s CPU (this process, DuckDB's "
              f"threads included): {got.samples / wall:,.0f} samples/s wall, {got.samples / cpu:,.0f} per CPU second")
        print(f"closed hours archived in {archive_s:.1f} s; peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
