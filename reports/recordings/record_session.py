"""Record a real vLLM session for `vllm-sentinel demo --replay` (run by hand; prints progress).

Starts the real vLLM CPU server with the scenario settings, runs the sidecar in-process (the same
daemon as `vllm-sentinel run`), plays scenarios in sequence, then exports the window with
agent/record.py. Keeps the sidecar's database too, so the window can be diagnosed again.

    .venv/bin/python reports/recordings/record_session.py \
        --out reports/recordings/cpu-tiny-llama.prom.gz --db /tmp/rec.duckdb \
        --scenarios healthy,queue_blocking,kv_cache_pressure,engine_stall
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vllm_sentinel.agent import liveconfig, scenarios
from vllm_sentinel.agent.daemon import DaemonOptions, build_sidecar
from vllm_sentinel.agent.record import NOISY_METRICS, export_window
from vllm_sentinel.agent.replay_demo import metadata_path
from vllm_sentinel.agent.store import Store
from vllm_sentinel.agent.tiny_model import build_tiny_model
from vllm_sentinel.agent.vllm_server import VllmServer
from vllm_sentinel.collectors.base import now_ms


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the .prom.gz to write")
    ap.add_argument("--db", type=Path, required=True, help="the sidecar's database (kept)")
    ap.add_argument("--scenarios", default="healthy,queue_blocking,kv_cache_pressure,engine_stall")
    ap.add_argument("--seconds", default="", help="per-scenario hold, e.g. healthy=30,queue_blocking=100")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds of idle between scenarios")
    ap.add_argument("--min-step-ms", type=int, default=0, help="thin each series to one sample per this many ms")
    args = ap.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    seconds = {k: float(v) for k, v in (kv.split("=") for kv in args.seconds.split(",") if kv)}
    if args.db.exists():
        sys.exit(f"{args.db} exists; pass a new path")
    server = VllmServer(scenarios.scenario_server_config(build_tiny_model()),
                        log_path=args.db.with_suffix(".vllm.log"))
    say(f"starting vLLM: {' '.join(server.command()[3:])}")
    server.start()
    say(f"vLLM ready in {server.startup_seconds:.0f} s at {server.url}")
    runs = []
    try:
        sidecar = build_sidecar(DaemonOptions(targets=[server.url], db=args.db, interval_s=1.0, metrics_port=None))
        sidecar.start()
        try:
            time.sleep(5)  # a few scrapes before the first scenario
            start = now_ms() - 4000
            runs = scenarios.run_sequence(server, names, say=say, seconds=seconds, gap_s=args.gap)
            time.sleep(2)
            end = now_ms()
        finally:
            sidecar.stop()
            sidecar.store.close()
    finally:
        server.stop()
    with Store.open(args.db, read_only=True) as store:
        res = export_window(store, start, end, args.out, min_step_ms=args.min_step_ms)
        snapshots = [liveconfig.load_snapshot_at(store, server.instance, start)] + \
            liveconfig.snapshot_history(store, server.instance, start, end)[1:]
    meta = {"made_by": "reports/recordings/record_session.py " + " ".join(sys.argv[1:]),
            "start_ms": start, "end_ms": end, "server_command": server.command()[3:],
            "startup_seconds": server.startup_seconds, "dropped_patterns": list(NOISY_METRICS),
            "dropped_metrics": res.dropped_metrics, "samples": res.samples, "series": res.series,
            "bytes": res.bytes, "scenarios": [r.as_dict() for r in runs],
            "config_snapshots": [{"ts": c.ts_ms, "instance": c.instance, "config": c.values, "sources": c.sources}
                                 for c in snapshots if c is not None]}
    metadata_path(args.out).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")
    say(f"wrote {args.out}: {res.samples} samples, {res.series} series, {res.bytes / 1024:.0f} KiB")
    for r in runs:
        say(f"  {r.name}: {r.seconds:.0f} s, traffic {r.traffic.ok if r.traffic else '-'} ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
