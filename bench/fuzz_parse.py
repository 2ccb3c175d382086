"""Hostile-input throughput: payloads per second through the parser, and the slowest per KB.

Run: .venv/bin/python bench/fuzz_parse.py [--count N] [--seed S]
Parses the same seeded payloads as tests/collectors/test_exposition_fuzz.py (mutated real
captures) plus the pathological shapes at 64 KB, strict and lenient, and prints the figures.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.collectors.hostile

from tests.collectors.hostile import SHAPES, payloads  # noqa: E402
from vllm_sentinel.collectors import exposition  # noqa: E402


def _parse_both(text: str) -> None:
    try:
        exposition.parse(text)
    except exposition.ParseError:
        pass
    exposition.parse(text, strict=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=20261201)
    args = ap.parse_args()
    texts = list(payloads(args.seed, args.count))
    total_bytes = sum(len(t) for _, t in texts)
    slowest = (0.0, "")
    start = time.perf_counter()
    for name, text in texts:
        exposition._valid_heads.clear()  # every payload as a first scrape: validation paid in full
        t0 = time.perf_counter()
        _parse_both(text)
        per_kb = (time.perf_counter() - t0) * 1000 / max(len(text) / 1024, 1)
        slowest = max(slowest, (per_kb, name))
    elapsed = time.perf_counter() - start
    print(f"{len(texts)} mutated payloads, {total_bytes / 1e6:.1f} MB, strict + lenient: "
          f"{len(texts) / elapsed:.0f} payloads/s, {total_bytes / 1e6 / elapsed:.1f} MB/s")
    print(f"slowest: {slowest[0]:.3f} ms/KB ({slowest[1]})")
    print(f"{'shape at 64 KB':52} {'ms':>8} {'ms/KB':>7}")
    for shape, build in SHAPES.items():
        text = build(64 * 1024)
        exposition._valid_heads.clear()
        t0 = time.perf_counter()
        _parse_both(text)
        ms = (time.perf_counter() - t0) * 1000
        print(f"{shape:52} {ms:8.2f} {ms / (len(text) / 1024):7.3f}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
