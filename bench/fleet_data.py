"""Generate a vLLM fleet's history from a real capture: N instances x a window of scrapes, as a text dump.

Every series of a real vLLM 0.32 /metrics page (../shared/reference/, captured from the CPU server)
is kept, per instance, with its labels. Counters and histograms grow with the requests each
instance finished, in the capture's own proportions (tokens per request, the bucket shares of every
latency histogram); gauges follow the load. So the data reads like vLLM's, only longer and wider.
Episodes are laid over the hour so the rule pack has something to find:

* model A: replica 00 takes 4x its share from 20 to 35 min and queues (waiting, queue time of
  seconds) while the other replicas of A idle -> queue_blocking and load_imbalance;
* replica 08 (model B) preempts from 40 to 50 min with a full KV cache -> kv_cache_pressure;
* the capture was taken under preemption on 2 CPU cores: its TTFT p95 (about 2.3 s) is above the 2 s
  objective on every replica all hour -> ttft_slo_breach everywhere (work for the evidence queries);
* replica 09 stops answering from 30 to 40 min (only `up 0`) -> target_down.

The dump is the format `vllm-sentinel ingest` reads (ms timestamps), one series after another,
so bench/prometheus_diagnose.py can backfill the same samples into Prometheus with promtool.

    .venv/bin/python bench/fleet_data.py --instances 16 --hours 1 --out /tmp/fleet.prom
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_sentinel.collectors.exposition import parse, parse_labels  # noqa: E402
from vllm_sentinel.collectors.base import format_labels  # noqa: E402

CAPTURE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "vllm-0.32.0-cpu-after-preemptions.prom.txt"
MAX_NUM_SEQS = 8
SLOW_QUEUE_S = 3.0  # a queued request's wait in an episode (lands in the 5 s bucket)
QUEUED_FAMILIES = ("vllm:request_queue_time_seconds", "vllm:time_to_first_token_seconds",
                   "vllm:e2e_request_latency_seconds")


@dataclass
class Phase:
    """What one instance does at one time: request rate, queue, preemption, reachability."""

    rate: float
    waiting: float = 0.0
    preempt_per_s: float = 0.0
    down: bool = False


def phase(i: int, t_s: float, base_rate: float) -> Phase:
    """Instance i's phase t_s seconds into the window (see the module docstring)."""
    minute = t_s / 60
    wave = 1 + 0.2 * math.sin(t_s / 300 + i)
    if i == 9 and 30 <= minute < 40:
        return Phase(0.0, down=True)
    if i == 0 and 20 <= minute < 35:
        return Phase(4 * base_rate * wave, waiting=6 + 6 * ((t_s // 15) % 2))
    if i == 8 and 40 <= minute < 50:
        return Phase(base_rate * wave, preempt_per_s=0.5)
    if i < 8 and 20 <= minute < 35:
        return Phase(0.3 * base_rate * wave)  # the router sends A's traffic to replica 00
    return Phase(base_rate * wave)


def _family(name: str) -> str:
    return re.sub(r"_(bucket|count|sum|total)$", "", name)


def generate(out: Path, instances: int, start_ms: int, seconds: int, interval_s: int, seed: int = 7) -> int:
    """Write the dump; returns the number of samples."""
    cap = parse(CAPTURE.read_text(encoding="utf-8"), strict=False)
    requests = sum(v for n, v in zip(cap.names, cap.values) if n == "vllm:request_success_total") or 1.0
    rng = random.Random(seed)
    steps = seconds // interval_s + 1
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"# vllm-sentinel bench fleet: {instances} instances x {seconds} s every {interval_s} s, from {CAPTURE.name}\n")
        for i in range(instances):
            inst, model = f"gpu-node-{i:02d}:8000", ("model-a" if i < 8 else "model-b")
            base_rate = 1.5 + rng.random()
            phases = [phase(i, k * interval_s, base_rate) for k in range(steps)]
            done, slow, preempted, acc = [], [], [], [0.0, 0.0, 0.0]
            for p in phases:  # cumulative requests, queued requests and preemptions at each scrape
                acc[0] += p.rate * interval_s
                acc[1] += (p.rate * interval_s) if p.waiting else 0.0
                acc[2] += p.preempt_per_s * interval_s
                done.append(acc[0]), slow.append(acc[1]), preempted.append(acc[2])
            for name, label_text, value in zip(cap.names, cap.labels, cap.values):
                labels = parse_labels(label_text) if label_text else {}
                if "model_name" in labels:
                    labels["model_name"] = model
                labels.update(instance=inst, job="vllm")
                head = f"{name}{{{format_labels(labels)}}}"
                for k, p in enumerate(phases):
                    if p.down:
                        continue
                    v = _value(name, labels, value, requests, done[k], slow[k], preempted[k], p)
                    f.write(f"{head} {v!r} {start_ms + k * interval_s * 1000}\n")
                    n += 1
            for k, p in enumerate(phases):  # Prometheus' own series of each scrape
                t = start_ms + k * interval_s * 1000
                f.write(f'up{{instance="{inst}",job="vllm"}} {0 if p.down else 1} {t}\n')
                n += 1
    return n


def _value(name: str, labels: dict[str, str], value: float, requests: float, done: float, slow: float,
           preempted: float, p: Phase) -> float:
    """One series' value at one scrape: grown with the requests done, or the gauge of the phase."""
    fam = _family(name)
    if name == "vllm:num_requests_running":
        return float(min(MAX_NUM_SEQS, max(1, round(p.rate * 1.2)) if p.rate else 0) if not p.waiting else MAX_NUM_SEQS)
    if name == "vllm:num_requests_waiting":
        return p.waiting
    if name == "vllm:num_requests_waiting_by_reason":  # vLLM: the reasons sum to num_requests_waiting
        return p.waiting if labels.get("reason") == "capacity" else 0.0
    if name == "vllm:kv_cache_usage_perc":
        return 0.99 if p.preempt_per_s else min(0.8, 0.05 * p.rate + (0.4 if p.waiting else 0))
    if name == "vllm:num_preemptions_total":
        return value + preempted
    if name == "process_cpu_seconds_total":
        return value + 0.15 * done  # 0.15 CPU-s per request: ~0.3 of a core at 2 requests/s
    if name.endswith(("_total", "_count", "_sum", "_bucket")) and fam.startswith("vllm:"):
        grown = value * done / requests
        if fam in QUEUED_FAMILIES:
            # queued requests in an episode wait seconds: they land in the buckets from 5 s up
            if name.endswith("_sum"):
                return grown + slow * SLOW_QUEUE_S
            if name.endswith("_count") or (name.endswith("_bucket") and _le(labels) >= 5.0):
                return grown + slow
        return grown
    return value  # info series, *_created, process gauges: as captured


def _le(labels: dict[str, str]) -> float:
    le = labels.get("le", "+Inf")
    return math.inf if le in ("+Inf", "Inf") else float(le)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--interval", type=int, default=15, help="scrape interval in seconds")
    ap.add_argument("--end-ms", type=int, default=1_796_000_000_000)
    ap.add_argument("--out", type=Path, help="the dump to write (default: a temporary file, removed after)")
    a = ap.parse_args()
    seconds = int(a.hours * 3600)
    with tempfile.TemporaryDirectory(prefix="vllm-sentinel-fleet-") as tmp:
        out = a.out or Path(tmp) / "fleet.prom"
        t0 = time.perf_counter()
        n = generate(out, a.instances, a.end_ms - seconds * 1000, seconds, a.interval)
        print(f"{n:,} samples of {a.instances} instances over {seconds} s every {a.interval} s -> {out} "
              f"({out.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
