"""Record a real vLLM session for `vllm-sentinel demo --replay` (run by hand; prints progress).

Starts the real vLLM CPU server with the scenario settings, runs the sidecar in-process (the same
daemon as `vllm-sentinel run`), plays scenarios in sequence, then exports the window with
agent/demo/recording.py. Keeps the sidecar's database too, so the window can be diagnosed again.

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

from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.demo import scenarios
from vllm_sentinel.agent.daemon.wiring import DaemonOptions, build_sidecar
from vllm_sentinel.agent.demo.recording import NOISY_METRICS, RECORDING_DROP, export_window
from vllm_sentinel.agent.demo.replay import metadata_path
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.demo.tiny_model import build_tiny_model
from vllm_sentinel.agent.demo.vllm_server import VllmServer
from vllm_sentinel.collectors.base import now_ms


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def record(args: argparse.Namespace) -> dict:
    """Run the server, the sidecar and the scenarios; return the session's metadata (no export yet)."""
    names = [n for n in args.scenarios.split(",") if n]
    seconds = {k: float(v) for k, v in (kv.split("=") for kv in args.seconds.split(",") if kv)}
    if args.db.exists():
        sys.exit(f"{args.db} exists; pass a new path (or --from-db to export it again)")
    server = VllmServer(scenarios.scenario_server_config(build_tiny_model()),
                        log_path=args.db.with_suffix(".vllm.log"))
    say(f"starting vLLM: {' '.join(server.command()[3:])}")
    server.start()
    say(f"vLLM ready in {server.startup_seconds:.0f} s at {server.url}")
    runs = []
    try:
        sidecar = build_sidecar(DaemonOptions(targets=[server.url], db=args.db, interval_s=1.0, metrics_port=None,
                                              rules=args.rules))
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
    for r in runs:
        say(f"  {r.name}: {r.seconds:.0f} s, traffic {r.traffic.ok if r.traffic else '-'} ok")
    return {"recorded_by": "reports/recordings/record_session.py " + " ".join(sys.argv[1:]),
            "start_ms": start, "end_ms": end, "instance": server.instance, "server_command": server.command()[3:],
            "startup_seconds": server.startup_seconds, "scenarios": [r.as_dict() for r in runs]}


def export(db: Path, meta: dict, out: Path, min_step_ms: int, drop: tuple[str, ...]) -> dict:
    """Write the recording and its metadata (with the configuration snapshots taken while vLLM ran)."""
    start, end = meta["start_ms"], meta["end_ms"]
    # after target_down the sidecar has no vLLM command line to read, and its snapshots fall back to
    # vLLM's defaults (max_num_seqs 128): keep only the ones taken while the server ran
    stopped = next((t for s in meta["scenarios"] for n, t in s["phases"] if n == "stopping"), end)
    with Store.open(db, read_only=True) as store:
        res = export_window(store, start, end, out, drop=drop, min_step_ms=min_step_ms)
        snapshots = [c for c in liveconfig.snapshot_history(store, meta["instance"], start, end)
                     if c.ts_ms is not None and c.ts_ms < stopped]
    meta = dict(meta, exported_by="reports/recordings/record_session.py " + " ".join(sys.argv[1:]),
                dropped_patterns=list(drop), dropped_metrics=res.dropped_metrics, min_step_ms=min_step_ms,
                samples=res.samples, series=res.series, bytes=res.bytes,
                config_snapshots=[{"ts": c.ts_ms, "instance": c.instance, "config": c.values, "sources": c.sources}
                                  for c in snapshots])
    metadata_path(out).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")
    say(f"wrote {out}: {res.samples} samples, {res.series} series, {res.bytes / 1024:.0f} KiB")
    return meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the .prom.gz to write (its .json beside it)")
    ap.add_argument("--db", type=Path, required=True, help="the sidecar's database (kept)")
    ap.add_argument("--from-db", type=Path, metavar="META_JSON",
                    help="do not record: export --db again, with the session metadata from this .json")
    ap.add_argument("--scenarios", default="healthy,queue_blocking,kv_cache_pressure,engine_stall")
    ap.add_argument("--seconds", default="", help="per-scenario hold, e.g. healthy=30,queue_blocking=100")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds of idle between scenarios")
    ap.add_argument("--rules", type=Path, action="append",
                    help="rule files for the live sidecar (default: the shipped pack); the recording holds samples only")
    ap.add_argument("--min-step-ms", type=int, default=2000, help="thin each series to one sample per this many ms")
    ap.add_argument("--keep-all-metrics", action="store_true", help="drop only python_gc_*/http_* (bigger file)")
    args = ap.parse_args(argv)
    if args.from_db:
        meta = json.loads(args.from_db.read_text())
        meta = {k: meta[k] for k in ("recorded_by", "start_ms", "end_ms", "instance", "server_command",
                                     "startup_seconds", "scenarios") if k in meta}
    else:
        meta = record(args)
    export(args.db, meta, args.out, args.min_step_ms, NOISY_METRICS if args.keep_all_metrics else RECORDING_DROP)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
