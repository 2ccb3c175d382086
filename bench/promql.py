"""Benchmark: wall time and peak memory of 15 typical rule expressions evaluated as range queries.

Data: ~500 vLLM-shaped series per instance (counters, gauges, DCGM gauges, histograms with vLLM's
buckets) at 1-second resolution, written through Store.append_many into a temporary DuckDB file.
Each scenario loads in one subprocess and evaluates in a fresh one, so peak RSS is the query's own.

    python bench/promql.py                       # 1 h x 1 instance, 1 h x 16 instances
    python bench/promql.py --scenario 16:24      # 24 h x 16 instances (needs time and disk)
    python bench/promql.py --step 5              # evaluation step in seconds (default 5, the daemon's)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RULES = [
    "sum by (instance, model_name) (rate(vllm:prompt_tokens_total[1m]))",
    "sum by (instance) (rate(vllm:generation_tokens_total[1m]))",
    "rate(vllm:num_preemptions_total[1m]) > 0.1",
    "histogram_quantile(0.95, sum by (instance, le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
    "histogram_quantile(0.99, sum by (instance, le) (rate(vllm:inter_token_latency_seconds_bucket[5m])))",
    "histogram_quantile(0.95, sum by (instance, model_name, le) "
    "(rate(vllm:request_queue_time_seconds_bucket[1m]))) > 1",
    "max_over_time(vllm:num_requests_waiting[5m])",
    "max_over_time(vllm:kv_cache_usage_perc[1m]) > 0.9",
    "avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) < 20",
    "sum by (instance) (vllm:num_requests_waiting) > 0 and sum by (instance) (vllm:num_requests_running) < 1",
    "predict_linear(DCGM_FI_DEV_FB_USED[10m], 600) > 80000",
    "rate(vllm:e2e_request_latency_seconds_sum[1m]) / rate(vllm:e2e_request_latency_seconds_count[1m])",
    "increase(vllm:request_success_total[5m])",
    "deriv(vllm:kv_cache_usage_perc[5m])",
    "sum by (instance) (irate(vllm:generation_tokens_total[30s])) "
    "/ on (instance) sum by (instance) (vllm:num_requests_running)",
]

BUCKETS = {
    "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                         2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "vllm:inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                                         5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "vllm:request_queue_time_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
    "vllm:e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                                         50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
    "vllm:request_prefill_time_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                                          50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
    "vllm:request_decode_time_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                                         50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
    "vllm:iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    "vllm:request_prompt_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000],
    "vllm:request_generation_tokens": [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000],
    "vllm:request_time_per_output_token_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                                   0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
}


def _series_layout() -> list[tuple[str, str, str]]:
    """(kind, metric, label text) of the ~500 series of one instance."""
    out: list[tuple[str, str, str]] = []
    for engine in ("0", "1"):
        base = f'engine="{engine}",model_name="llama"'
        for c in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"):
            out.append(("counter", c, base))
        for reason in ("stop", "length", "abort"):
            out.append(("counter", "vllm:request_success_total", f'{base},finished_reason="{reason}"'))
        for g in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            out.append(("gauge", g, base))
        for h, bounds in BUCKETS.items():
            for le in [*map(str, bounds), "+Inf"]:
                out.append(("bucket", f"{h}_bucket", f'{base},le="{le}"'))
            out.append(("counter", f"{h}_sum", base))
            out.append(("counter", f"{h}_count", base))
    for gpu in range(8):
        for g in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE",
                  "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE"):
            out.append(("gauge", g, f'gpu="{gpu}",UUID="GPU-{gpu}",modelName="H200"'))
    return out


def load(db: str, instances: int, hours: float, chunk_s: int = 300) -> dict:
    """Write the synthetic history through Store.append_many, chunk by chunk; returns counts and time."""
    from vllm_sentinel.agent.store.db import Store
    from vllm_sentinel.collectors.base import Batch

    layout = _series_layout()
    kinds = np.array([k for k, _, _ in layout])
    rng = np.random.default_rng(7)
    seconds = int(hours * 3600)
    t0 = 1_780_000_000_000 // 3_600_000 * 3_600_000
    started = time.perf_counter()
    written = 0
    with Store.open(db) as store:
        state = {i: np.zeros(len(layout)) for i in range(instances)}
        for start in range(0, seconds, chunk_s):
            n = min(chunk_s, seconds - start)
            batches = []
            for inst in range(instances):
                steps = rng.integers(0, 20, size=(n, len(layout))).astype(np.float64)
                cum = state[inst] + np.cumsum(np.where(kinds == "gauge", 0, steps), axis=0)
                state[inst] = cum[-1]
                values = np.where(kinds == "gauge", rng.random((n, len(layout))) * 100, cum)
                ts = (t0 + (start + np.arange(n)) * 1000).repeat(len(layout))
                b = Batch(instance=f"10.0.0.{inst}:8000", ts_ms=int(ts[0]))
                b.metrics = [m for _, m, _ in layout] * n
                b.labels = [lb for _, _, lb in layout] * n
                b.values = values.ravel().tolist()
                b.timestamps_ms = ts.tolist()
                batches.append(b)
            written += store.append_many(batches)
        store.sort_closed(t0 + seconds * 1000 + 10 * 3_600_000)
    return {"series": len(layout) * instances, "samples": written, "load_s": round(time.perf_counter() - started, 1),
            "t0": t0, "seconds": seconds}


def evaluate(db: str, t0: int, seconds: int, step_s: int) -> dict:
    """Evaluate every rule as a range query over the whole history; wall times and peak RSS."""
    from vllm_sentinel.agent.promql.engine import Engine
    from vllm_sentinel.agent.store.db import Store

    times = {}
    with Store.open(db, read_only=True) as store:
        engine = Engine(store)
        start, end = t0 + 600_000, t0 + seconds * 1000  # from 10 min in, so every window is full
        total, total_cpu = time.perf_counter(), time.process_time()
        for expr in RULES:
            t, cpu = time.perf_counter(), time.process_time()
            series = engine.range(expr, start, end, step_s * 1000)
            times[expr] = (round(time.perf_counter() - t, 3), len(series), round(time.process_time() - cpu, 3))
        total, total_cpu = time.perf_counter() - total, time.process_time() - total_cpu
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # CPU seconds (all threads) beside wall time: on a shared, loaded machine wall time mostly measures the wait
    return {"total_s": round(total, 2), "cpu_s": round(total_cpu, 2), "peak_rss_mib": round(peak_mib),
            "per_rule": times, "steps": (end - start) // (step_s * 1000) + 1}


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the scenarios in subprocesses and print one line per scenario (plus per-rule times)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", action="append", help="INSTANCES:HOURS (repeatable); default 1:1 and 16:1")
    ap.add_argument("--step", type=int, default=5, help="range query step in seconds")
    ap.add_argument("--per-rule", action="store_true", help="print each rule's time")
    ap.add_argument("--_load", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--_eval", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._load:
        print(json.dumps(load(args._load[0], int(args._load[1]), float(args._load[2]))))
        return
    if args._eval:
        db, t0, seconds, step = args._eval
        print(json.dumps(evaluate(db, int(t0), int(seconds), int(step))))
        return
    for scenario in args.scenario or ["1:1", "16:1"]:
        instances, hours = scenario.split(":")
        with tempfile.TemporaryDirectory(prefix="promql-bench-") as tmp:
            db = str(Path(tmp) / "bench.duckdb")
            loaded = _child(["--_load", db, instances, hours])
            size_mib = Path(db).stat().st_size / 2**20
            res = _child(["--_eval", db, str(loaded["t0"]), str(loaded["seconds"]), str(args.step)])
        print(f"{instances:>2} instance(s) x {hours} h: {loaded['series']} series, {loaded['samples']:,} samples "
              f"({size_mib:.0f} MiB, loaded in {loaded['load_s']} s); 15 rules as range queries, "
              f"{res['steps']} steps of {args.step} s: {res['total_s']} s wall ({res['cpu_s']} s CPU), "
              f"peak RSS {res['peak_rss_mib']} MiB")
        if args.per_rule:
            for expr, (secs, n, cpu) in res["per_rule"].items():
                print(f"    {secs:7.3f} s  ({cpu:7.3f} s CPU)  {n:4d} series  {expr}")


if __name__ == "__main__":
    main()
