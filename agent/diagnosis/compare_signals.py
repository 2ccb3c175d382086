"""The signals `compare` weighs, as PromQL over any engine: one value per window and one per interval.

Each signal is a template with `{w}` = seconds: over a whole window it gives the window's value
(quantiles of every request that finished in it, counts divided by its length), over each interval
of a range query the per-interval values that the significance test compares. Counters and
histograms, not sampled gauges, wherever the metric allows: a busy host answers /metrics between
engine steps (KV usage and GPU activity are gauges: averaged over every scrape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_sentinel.agent.promql.remote import instant_all, range_all

LOWER_IS_BETTER, HIGHER_IS_BETTER, NEUTRAL = -1, 1, 0


@dataclass(frozen=True)
class Signal:
    """One compared signal: its PromQL template ({w} = seconds), unit, and which way is better."""

    name: str
    expr: str
    unit: str
    direction: int
    per_request: bool = False  # a count per second that grows with load: compared per finished request
    headline: bool = False  # weighs in the verdict (p95s, throughput, preemptions: one per family)


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (instance, le) (increase(vllm:{histogram}_bucket[{{w}}s])))"


def _latencies() -> list[Signal]:
    out = []
    for short, histogram in (("ttft", "time_to_first_token_seconds"), ("itl", "inter_token_latency_seconds"),
                             ("queue_time", "request_queue_time_seconds"), ("e2e", "e2e_request_latency_seconds")):
        for q in (0.5, 0.95, 0.99):
            name = f"{short}_p{round(q * 100)}_seconds"
            out.append(Signal(name, _quantile(q, histogram), "s", LOWER_IS_BETTER, headline=q == 0.95))
    return out


def _rate(counter: str) -> str:
    return f"sum by (instance) (increase({counter}[{{w}}s])) / {{w}}"


REQUEST_RATE = "request_rate_per_s"
SIGNALS: list[Signal] = _latencies() + [
    Signal(REQUEST_RATE, _rate("vllm:request_success_total"), "1/s", HIGHER_IS_BETTER, headline=True),
    Signal("prompt_tokens_per_s", _rate("vllm:prompt_tokens_total"), "tokens/s", HIGHER_IS_BETTER),
    Signal("generation_tokens_per_s", _rate("vllm:generation_tokens_total"), "tokens/s", HIGHER_IS_BETTER,
           headline=True),
    Signal("preemptions_per_s", _rate("vllm:num_preemptions_total"), "1/s", LOWER_IS_BETTER, per_request=True,
           headline=True),
    Signal("kv_cache_usage_ratio", "avg by (instance) (avg_over_time(vllm:kv_cache_usage_perc[{w}s]))", "ratio",
           NEUTRAL),
    Signal("gpu_util_percent", "avg by (instance) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[{w}s]))", "%", NEUTRAL),
    Signal("dram_active_ratio", "avg by (instance) (avg_over_time(DCGM_FI_PROF_DRAM_ACTIVE[{w}s]))", "ratio",
           NEUTRAL),
]
BY_NAME = {s.name: s for s in SIGNALS}


@dataclass
class WindowValues:
    """One instance over one window: each signal's whole-window value and its per-interval points."""

    whole: dict[str, float | None]
    intervals: dict[str, list[tuple[int, float | None]]]  # [(interval end ms, value)]


def _finite(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) or math.isinf(v) else float(v)


def window_values(engine: object, instance: str, start_ms: int, end_ms: int, interval_ms: int) -> WindowValues:
    """Every signal of `instance` over (start_ms, end_ms]: the window's value and each interval's.

    The intervals end at start + k * interval_ms (k = 1, 2, ...) and cover what finished in them;
    a signal without data is None (whole) or has no points.
    """
    seconds = max(1, (end_ms - start_ms) // 1000)
    step_s = max(1, interval_ms // 1000)
    wholes = instant_all(engine, [(s.expr.format(w=seconds), end_ms) for s in SIGNALS])
    first = start_ms + interval_ms
    ranges = range_all(engine, [(s.expr.format(w=step_s), first, end_ms, interval_ms) for s in SIGNALS]) \
        if first <= end_ms else [[] for _ in SIGNALS]
    whole: dict[str, float | None] = {}
    intervals: dict[str, list[tuple[int, float | None]]] = {}
    for sig, result, series in zip(SIGNALS, wholes, ranges):
        whole[sig.name] = next((_finite(x.value) for x in (result if isinstance(result, list) else [])
                                if x.labels.get("instance") == instance), None)
        points = next((s.points for s in series if s.labels.get("instance") == instance), [])
        intervals[sig.name] = [(int(t), _finite(v)) for t, v in points]
    return WindowValues(whole, intervals)


def present(values: WindowValues) -> set[str]:
    """The signals with data in the window (GPU series are absent on a CPU host, for one)."""
    return {k for k, v in values.whole.items() if v is not None} | \
        {k for k, pts in values.intervals.items() if any(v is not None for _, v in pts)}
