"""CPU of the daemon's live rule evaluation: the whole pack at advancing times over N targets, windows kept.

Writes `--minutes` of 1 Hz ticks of the real vLLM capture (advancing counters) for `--targets`
targets, then, as the daemon does, writes 5 s more and evaluates the pack (the incidents table kept
current) `--evaluations` times. Prints CPU per evaluation (median, max) and peak RSS; asserts nothing.

    .venv/bin/python bench/live_rules.py                  # 16 targets, 12 min, 24 evaluations
    .venv/bin/python bench/live_rules.py --profile 30     # and the 30 costliest functions (cProfile)
    .venv/bin/python bench/live_rules.py --targets 1 --gpus 1   # a GPU host: one target, its GPU's NVML series

--gpus N adds, per target, N GPUs' series replayed from the NVML collector's H200 recording (so the GPU
rules, predict_linear over 10 minutes among them, have their data).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from store import PAYLOAD, advancing_payloads, tick_batches  # noqa: E402

from vllm_sentinel.agent.alerts.rulepack import load_pack  # noqa: E402
from vllm_sentinel.agent.diagnosis.incidents import Evaluator  # noqa: E402
from vllm_sentinel.agent.store.db import Store  # noqa: E402
from vllm_sentinel.collectors.base import Batch  # noqa: E402


NVML_RECORDING = Path(__file__).resolve().parents[1] / "tests/collectors/fixtures/nvml/nvml-h200.prom.gz"


def nvml_series() -> list[tuple[str, dict[str, str], list[float]]]:
    """(metric, labels, values in time order) of each series the NVML collector recorded on the H200."""
    import gzip

    from vllm_sentinel.agent.promql.notation import parse_series_selector

    series: dict[str, tuple[str, dict[str, str], list[float]]] = {}
    for line in gzip.open(NVML_RECORDING, "rt"):
        if line.startswith("#") or not line.strip():
            continue
        key, value, _ts = line.rsplit(" ", 2)
        if key not in series:
            name, labels = parse_series_selector(key)
            series[key] = (name, labels, [])
        series[key][2].append(float(value))
    return list(series.values())


def gpu_batches(recorded: list, ts: int, tick: int, targets: int, gpus: int) -> list[Batch]:
    """One tick of `gpus` GPUs per target, the recording's values cycled."""
    out = []
    for t in range(targets):
        b = Batch(instance=f"10.0.0.{t}:8000", ts_ms=ts)
        for g in range(gpus):
            for name, labels, values in recorded:
                b.add(name, {**labels, "gpu": str(g), "UUID": f"GPU-{t}-{g}"}, values[tick % len(values)])
        out.append(b)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=16)
    ap.add_argument("--minutes", type=int, default=12, help="history written before the measured evaluations")
    ap.add_argument("--evaluations", type=int, default=24)
    ap.add_argument("--gpus", type=int, default=0, help="GPUs per target, their NVML series replayed from the H200 recording")
    ap.add_argument("--profile", type=int, default=0, help="print this many functions by cumulative time")
    ap.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"],
                    help="order of the --profile listing (tottime: time inside the function itself)")
    a = ap.parse_args()
    payloads = advancing_payloads(PAYLOAD.read_text(), 120)
    recorded = nvml_series() if a.gpus else []
    shapes: dict = {}
    with tempfile.TemporaryDirectory() as d, Store.open(Path(d) / "live.duckdb") as store:
        t0 = (int(time.time()) // 3600) * 3_600_000 - 3_600_000
        tick = 0

        def write(seconds: int) -> None:
            nonlocal tick
            for _ in range(seconds):
                batches = tick_batches(payloads[tick % len(payloads)], t0 + tick * 1000, a.targets, shapes)
                if a.gpus:
                    batches += gpu_batches(recorded, t0 + tick * 1000, tick, a.targets, a.gpus)
                store.append_many(batches)
                tick += 1

        write(a.minutes * 60)
        evaluator = Evaluator(load_pack(None))
        evaluator(store, t0 + tick * 1000)  # the first evaluation reads the windows whole
        cpu: list[float] = []
        prof = cProfile.Profile() if a.profile else None
        for _ in range(a.evaluations):
            write(5)
            started = time.process_time()
            if prof:
                prof.enable()
            evaluator(store, t0 + tick * 1000)
            if prof:
                prof.disable()
            cpu.append(time.process_time() - started)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{a.targets} targets{f' with {a.gpus} GPU(s) each' if a.gpus else ''}, {a.minutes} min of 1 Hz history, {store.series_count:,} series: "
              f"rule pack evaluated {a.evaluations} times 5 s apart, CPU per evaluation median "
              f"{statistics.median(cpu) * 1000:.1f} ms, max {max(cpu) * 1000:.1f} ms; peak RSS {peak:.0f} MiB")
        if prof:
            pstats.Stats(prof).sort_stats(a.sort).print_stats(a.profile)


if __name__ == "__main__":
    main()
