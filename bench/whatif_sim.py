"""The scheduler model (agent/diagnosis/sim_scheduler.py) on an hour of one instance: wall seconds, steps, peak RSS.

A seeded synthetic hour (Poisson arrivals; prompt and output lengths uniform in a range) is served under
three configurations: a roomy GPU (max_num_seqs 256, 20,000 blocks of 16 tokens), the same GPU starved
of KV cache (400 blocks: it preempts), and a CPU-like instance (blocks of 128 tokens, 8 blocks,
max_num_seqs 4, 0.3 req/s, 150-token prompts, 450-token outputs). Each runs until every request
finished, so an overloaded configuration simulates more than the hour. Prints figures; asserts nothing.

    .venv/bin/python bench/whatif_sim.py [--hours 1] [--rate 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig, SimRequest, StepTime, simulate

GPU_STEP = StepTime(base_s=0.008, per_prefill_token_s=6e-5, per_decode_seq_s=1e-4, per_context_token_s=3e-8)
CPU_STEP = StepTime(base_s=0.025, per_prefill_token_s=3e-4, per_decode_seq_s=2e-3, per_context_token_s=1e-6)


def workload(seconds: float, rate: float, prompt: tuple[int, int], output: tuple[int, int],
             seed: int) -> list[SimRequest]:
    """Poisson arrivals over `seconds`, prompt and output lengths uniform in [lo, hi]."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(seconds * rate * 1.2) + 10))
    arrivals = arrivals[arrivals < seconds]
    prompts = rng.integers(prompt[0], prompt[1] + 1, len(arrivals))
    outputs = rng.integers(output[0], output[1] + 1, len(arrivals))
    return [SimRequest(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=3.0, help="requests per second on the GPU configurations")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    seconds = a.hours * 3600
    gpu_load = workload(seconds, a.rate, (200, 2000), (100, 500), a.seed)
    cpu_load = workload(seconds, 0.3, (150, 150), (450, 450), a.seed)
    gpu = dict(max_num_seqs=256, max_num_batched_tokens=8192, block_size=16, max_model_len=8192)
    cases = [
        ("GPU, 20,000 blocks of 16", gpu_load, EngineConfig(num_blocks=20_000, **gpu), GPU_STEP),
        ("GPU, 400 blocks of 16", gpu_load, EngineConfig(num_blocks=400, **gpu), GPU_STEP),
        ("CPU, 8 blocks of 128, 4 seqs", cpu_load,
         EngineConfig(max_num_seqs=4, max_num_batched_tokens=2048, num_blocks=8, block_size=128,
                      max_model_len=2048), CPU_STEP),
    ]
    print(f"{'configuration':<30} {'requests':>8} {'prompt tok':>11} {'output tok':>11} {'simulated s':>11} "
          f"{'wall s':>7} {'steps':>9} {'preempt':>8} {'p95 ttft s':>10} {'p95 itl s':>9} {'RSS MiB':>8}")
    for name, load, config, step_time in cases:
        wall = time.perf_counter()
        r = simulate(load, config, step_time)
        wall = time.perf_counter() - wall
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{name:<30} {len(load):>8,} {sum(q.prompt_tokens for q in load):>11,} "
              f"{sum(q.output_tokens for q in load):>11,} {r.span_s:>11,.0f} {wall:>7.2f} {r.steps:>9,} "
              f"{r.total_preemptions:>8,} {r.quantile('ttft', 0.95):>10.2f} {r.quantile('itl', 0.95):>9.3f} "
              f"{rss:>8.0f}")
    print("RSS is the process's peak so far (ru_maxrss), the workloads included")


if __name__ == "__main__":
    main()
