"""The what-if model's calibration, and what a `whatif` costs: its replay of each window against what was measured.

Two histories:
* the recorded real session (reports/recordings/cpu-tiny-llama.prom.gz): each scenario's window
  (its first 20 s left out) replayed with the configuration that ran;
* bench/fleet_data.py's generated fleet (a real capture's proportions, laid over an hour): one
  instance's whole hour, and replica 08's preemption stretch.
For each: the figures the model is judged on (measured, modelled, error), whether its predictions are
withheld, and the wall seconds of the whole `whatif` (reading the window, fitting, replaying) in this
process, with the peak RSS at the end. Prints figures; asserts nothing.

    .venv/bin/python bench/whatif_calibration.py [--fleet-hours 1]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_data import generate  # noqa: E402  (the sibling bench's generator)

from vllm_sentinel.agent.demo.replay import default_recording, load_metadata, replay_into  # noqa: E402
from vllm_sentinel.agent.diagnosis.sim_calibrate import JUDGED  # noqa: E402
from vllm_sentinel.agent.diagnosis.whatif import WhatIfQuery, store_configs, whatif  # noqa: E402
from vllm_sentinel.agent.promql.engine import Engine  # noqa: E402
from vllm_sentinel.agent.store.db import Store  # noqa: E402
from vllm_sentinel.agent.store.ingest import ingest_file  # noqa: E402
from vllm_sentinel.agent.store.sample_reads import instances_with_samples  # noqa: E402

FLEET_START_MS = 1_796_000_000_000


def row(name: str, store: Store, start: int, end: int, instance: str | None) -> None:
    """One window's calibration and the whatif's wall time."""
    t0 = time.perf_counter()
    try:
        doc = whatif(Engine(store), store_configs(store, start, end), WhatIfQuery(start, end, instance))
    except Exception as e:  # a bench prints what it could not model and goes on
        print(f"{name:34} {type(e).__name__}: {str(e)[:110]}")
        return
    wall = time.perf_counter() - t0
    cal = doc["calibration"]
    cells = "  ".join(f"{k[:-2] if k.endswith('_s') else k} {_n(cal['measured'].get(k))}/{_n(cal['modelled'].get(k))}"
                      f" ({_pct(cal['error'].get(k))})" for k in JUDGED)
    state = "withheld" if doc["withheld"] else "predicts"
    print(f"{name:34} {doc['workload']['mode']:11} {wall:6.2f} s  {state:8}  {cells}")


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet-hours", type=float, default=1.0)
    args = ap.parse_args()
    print(f"{'window':34} {'load':11} {'wall':>8}  {'state':8}  measured/modelled (error) per judged figure")
    with tempfile.TemporaryDirectory() as tmp:
        meta = load_metadata(default_recording())
        with Store.open(Path(tmp) / "session.duckdb") as store:
            replay_into(store, default_recording())
            for s in meta["scenarios"]:
                row(f"recording: {s['name']}", store, s["start_ms"] + 20_000, s["end_ms"], None)
        dump = Path(tmp) / "fleet.prom"
        seconds = int(args.fleet_hours * 3600)
        generate(dump, 10, FLEET_START_MS, seconds, 1)
        with Store.open(Path(tmp) / "fleet.duckdb") as store:
            ingest_file(store, dump)
            end = FLEET_START_MS + seconds * 1000
            instances = sorted(instances_with_samples(store, FLEET_START_MS, end))
            row(f"fleet: {instances[0]}, whole window", store, FLEET_START_MS, end, instances[0])
            if len(instances) > 8:
                row(f"fleet: {instances[8]}, 40-50 min", store, FLEET_START_MS + 40 * 60_000,
                    FLEET_START_MS + 50 * 60_000, instances[8])
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
