"""Parse time per scrape: our parser vs prometheus_client, on the real captures and a 1,000-line payload.

Run: .venv/bin/python bench/parse.py [--runs N]
Prints the median of N runs in ms. "ours cold" parses with an empty validation cache (the first
scrape of a target); "ours" is every later scrape. "collect" is VllmCollector.collect() with the
body served from memory (parse + aliases + staleness + Batch), i.e. the CPU cost of one scrape
without the HTTP round trip.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from vllm_sentinel.collectors import exposition
from vllm_sentinel.collectors.vllm import Response, VllmCollector

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "collectors" / "fixtures"


def synthetic(lines: int = 1000) -> str:
    """A vLLM-shaped payload of exactly `lines` lines: histograms over engines, plus gauges."""
    out: list[str] = []
    bounds = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
              "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf"]
    family = 0
    while len(out) < lines:
        name = f"vllm:synthetic_latency_{family}_seconds"
        out += [f"# HELP {name} Synthetic latency.", f"# TYPE {name} histogram"]
        for engine in range(2):
            labels = f'engine="{engine}",model_name="meta-llama/Llama-3.1-8B-Instruct"'
            for i, le in enumerate(bounds):
                out.append(f'{name}_bucket{{engine="{engine}",le="{le}",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {i * 7}.0')
            out += [f"{name}_count{{{labels}}} 133.0", f"{name}_sum{{{labels}}} 12.5"]
        family += 1
    return "\n".join(out[:lines]) + "\n"


def median_ms(fn, runs: int, before=None) -> float:
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def reference(text: str) -> int:
    return sum(1 for fam in text_string_to_metric_families(text) for _ in fam.samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    payloads = [(p.name, p.read_text()) for p in sorted(FIXTURES.glob("*.txt"))]
    payloads.append(("synthetic-1000-lines", synthetic(1000)))
    print(f"median of {args.runs} runs, ms per parse")
    print(f"{'payload':48} {'lines':>5} {'samples':>7} {'ours':>6} {'cold':>6} {'collect':>7} "
          f"{'prom_client':>11} {'speedup':>7}")
    for name, text in payloads:
        parsed = exposition.parse(text)
        ours = median_ms(lambda: exposition.parse(text), args.runs)
        cold = median_ms(lambda: exposition.parse(text), max(args.runs // 4, 5),
                         before=exposition._valid_heads.clear)
        body = text.encode()
        collector = VllmCollector("127.0.0.1:8000",
                                  fetch=lambda url, t, m: Response(200, "text/plain; version=0.0.4", body))
        collect = median_ms(lambda: collector.collect(0), args.runs)
        ref = median_ms(lambda: reference(text), max(args.runs // 10, 5))
        lines = text.count("\n")
        print(f"{name:48} {lines:5d} {len(parsed):7d} {ours:6.3f} {cold:6.3f} {collect:7.3f} "
              f"{ref:11.2f} {ref / ours:6.1f}x")


if __name__ == "__main__":
    main()
