"""How many incidents of recorded dumps end with a fix that cannot compute, and why: the measure of fixes
made concrete when no command line is known.

Each dump is ingested into a fresh DuckDB file as `vllm-sentinel ingest` does (no configuration
snapshot: the configuration comes from the metrics, agent/diagnosis/metrics_config.py), then the
whole span is diagnosed with the shipped pack. Prints figures; asserts nothing.

    .venv/bin/python bench/cannot_compute.py reports/recordings/cpu-tiny-llama.prom.gz /tmp/fleet.prom
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_sentinel.agent.alerts.rulepack import load_pack  # noqa: E402
from vllm_sentinel.agent.diagnosis.diagnose import diagnose  # noqa: E402
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator  # noqa: E402
from vllm_sentinel.agent.store.db import Store  # noqa: E402
from vllm_sentinel.agent.store.ingest import ingest_file  # noqa: E402

CANNOT = "cannot compute"


def measure(dump: Path, pack: list, instance: str | None) -> tuple[int, list[tuple[str, str, str, str]]]:
    """(incidents, [(id, incident, param, why)] of the fixes that cannot compute) over the dump's whole span."""
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "s.duckdb") as store:
        ingest_file(store, dump, instance=instance)
        span = store.time_range()
        if span is None:
            return 0, []
        doc = diagnose(store, span[0] - 1, span[1] + 300_000, evaluate_window=pack_window_evaluator(pack))
    stuck = [(i["id"], i["incident"], f["param"], f["why"]) for i in doc["incidents"] for f in i["fixes"]
             if (f.get("why") or "").startswith(CANNOT)]
    return len(doc["incidents"]), stuck


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dumps", nargs="+", type=Path)
    ap.add_argument("--instance", help="instance label for dumps whose samples have none (a single /metrics page)")
    args = ap.parse_args()
    pack = load_pack()
    for dump in args.dumps:
        n, stuck = measure(dump, pack, args.instance)
        print(f"{dump}: {n} incidents, {len({s[0] for s in stuck})} with a fix that cannot compute")
        for _id, incident, param, why in stuck:
            print(f"  {incident} {param}: {why}")


if __name__ == "__main__":
    main()
