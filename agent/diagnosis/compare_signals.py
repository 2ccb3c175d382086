"""The signals `compare` weighs, as PromQL over any engine: one value per window and one per interval.

Each signal is a template with `{w}` = seconds, which over a whole window gives the window's value
(quantiles of every request that finished in it, counts divided by its length). The per-interval
values that the significance test compares come from the counters themselves: their values at
each interval boundary (a range query of the counter, or of the histogram's buckets), one
boundary minus the one before. Unlike increase() over each interval, which needs two scrapes
inside it, this loses no interval and no count where scrapes are sparse: a starved sidecar
stretches its interval to 8 s, a Prometheus scrapes every 15 s. A boundary reads the counter's
last sample before it, past any staleness marker: a scrape that timed out on a busy server marks
every series stale until the next one answers, and a counter that missed a scrape has not reset.
Counters and histograms, not sampled gauges, wherever the metric allows: a busy host answers
/metrics between engine steps (KV usage and GPU activity are gauges: averaged over every scrape
of each interval).

SLO attainment and goodput (agent/diagnosis/compare_slo.py) come from the same boundaries: the TTFT
and TPOT buckets' increases per interval, and the request counter's; over the whole window from
the buckets' increase().
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_sentinel.agent.diagnosis.compare_slo import (ATTAINMENT, GOODPUT, SLO_HISTOGRAMS, TTFT_HISTOGRAM, Buckets,
                                                       Objectives, SloReading, interval_values, side_values)
from vllm_sentinel.agent.promql.functions import bucket_quantile
from vllm_sentinel.agent.promql.remote import instant_all, range_all

LOWER_IS_BETTER, HIGHER_IS_BETTER, NEUTRAL = -1, 1, 0
BOUNDARY_LOOKBACK_S = 300  # a counter's value at a boundary: its last sample this far back (PromQL's lookback)


@dataclass(frozen=True)
class Signal:
    """One compared signal: its PromQL template ({w} = seconds), unit, and which way is better."""

    name: str
    expr: str
    unit: str
    direction: int
    per_request: bool = False  # a count per second that grows with load: compared per finished request
    headline: bool = False  # weighs in the verdict (p95s, throughput, preemptions: one per family)
    counter: str | None = None  # per interval: this counter's increase between boundaries, per second
    histogram: str | None = None  # per interval: the q-quantile of these buckets' increases between boundaries
    q: float | None = None


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (instance, le) (increase({histogram}_bucket[{{w}}s])))"


def _latencies() -> list[Signal]:
    out = []
    for short, histogram in (("ttft", "time_to_first_token_seconds"), ("itl", "inter_token_latency_seconds"),
                             ("queue_time", "request_queue_time_seconds"), ("e2e", "e2e_request_latency_seconds")):
        for q in (0.5, 0.95, 0.99):
            name = f"{short}_p{round(q * 100)}_seconds"
            out.append(Signal(name, _quantile(q, f"vllm:{histogram}"), "s", LOWER_IS_BETTER, headline=q == 0.95,
                              histogram=f"vllm:{histogram}", q=q))
    return out


def _rate(name: str, counter: str, unit: str, direction: int, **kw: bool) -> Signal:
    return Signal(name, f"sum by (instance) (increase({counter}[{{w}}s])) / {{w}}", unit, direction,
                  counter=counter, **kw)


REQUEST_RATE = "request_rate_per_s"
SIGNALS: list[Signal] = _latencies() + [
    _rate(REQUEST_RATE, "vllm:request_success_total", "1/s", HIGHER_IS_BETTER, headline=True),
    _rate("prompt_tokens_per_s", "vllm:prompt_tokens_total", "tokens/s", HIGHER_IS_BETTER),
    _rate("generation_tokens_per_s", "vllm:generation_tokens_total", "tokens/s", HIGHER_IS_BETTER, headline=True),
    _rate("preemptions_per_s", "vllm:num_preemptions_total", "1/s", LOWER_IS_BETTER, per_request=True,
          headline=True),
    Signal("kv_cache_usage_ratio", "avg by (instance) (avg_over_time(vllm:kv_cache_usage_perc[{w}s]))", "ratio",
           NEUTRAL),
    Signal("gpu_util_percent", "avg by (instance) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[{w}s]))", "%", NEUTRAL),
    Signal("dram_active_ratio", "avg by (instance) (avg_over_time(DCGM_FI_PROF_DRAM_ACTIVE[{w}s]))", "ratio",
           NEUTRAL),
]
# read from the TTFT and TPOT buckets against the objectives (compare_slo.py), not from a template of their own
SLO_SIGNALS: list[Signal] = [Signal(ATTAINMENT, "", "ratio", HIGHER_IS_BETTER),
                             Signal(GOODPUT, "", "1/s", HIGHER_IS_BETTER)]
BY_NAME = {s.name: s for s in SLO_SIGNALS + SIGNALS}


@dataclass
class WindowValues:
    """One instance over one window: each signal's whole-window value and its per-interval points."""

    whole: dict[str, float | None]
    intervals: dict[str, list[tuple[int, float | None]]]  # [(interval end ms, value)]
    slo: SloReading = field(default_factory=lambda: SloReading(False, None, None, None))


def _finite(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) or math.isinf(v) else float(v)


def window_values(engine: object, instance: str, start_ms: int, end_ms: int, interval_ms: int,
                  objectives: Objectives = Objectives()) -> WindowValues:
    """Every signal of `instance` over (start_ms, end_ms]: the window's value and each interval's.

    The intervals end at start + k * interval_ms (k = 1, 2, ...) and cover what finished in them;
    a signal without data is None (whole) or has no points. SLO attainment and goodput are judged
    against `objectives`.
    """
    seconds = max(1, (end_ms - start_ms) // 1000)
    step_s = max(1, interval_ms // 1000)
    buckets_expr = "sum by (instance, le) (increase({}_bucket[{}s]))"
    wholes = instant_all(engine, [(s.expr.format(w=seconds), end_ms) for s in SIGNALS] +
                         [(buckets_expr.format(h, seconds), end_ms) for h in SLO_HISTOGRAMS])
    whole = {sig.name: next((_finite(x.value) for x in _samples(result) if x.labels.get("instance") == instance), None)
             for sig, result in zip(SIGNALS, wholes)}
    whole_buckets = {h: _by_le(s for s in _samples(result) if s.labels.get("instance") == instance)
                     for h, result in zip(SLO_HISTOGRAMS, wholes[len(SIGNALS):])}
    read, whole[ATTAINMENT], whole[GOODPUT] = side_values(whole_buckets, whole.get(REQUEST_RATE), objectives)
    if start_ms + interval_ms > end_ms:
        return WindowValues(whole, {sig.name: [] for sig in SLO_SIGNALS + SIGNALS}, read)
    counters = sorted({s.counter for s in SIGNALS if s.counter})
    histograms = sorted({s.histogram for s in SIGNALS if s.histogram} | set(SLO_HISTOGRAMS))
    gauges = [s for s in SIGNALS if not s.counter and not s.histogram]
    # boundaries at start, start + interval, ...: what was counted by each, for the differences. The
    # last sample at or before each boundary, not the instant value: a failed scrape writes staleness
    # markers, and a boundary that fell after one would have no value and cost two intervals
    last = f"last_over_time({{}}[{BOUNDARY_LOOKBACK_S}s])"
    queries = [(f"sum by (instance) ({last.format(c)})", start_ms, end_ms, interval_ms) for c in counters]
    queries += [(f"sum by (instance, le) ({last.format(h + '_bucket')})", start_ms, end_ms, interval_ms)
                for h in histograms]
    queries += [(s.expr.format(w=step_s), start_ms + interval_ms, end_ms, interval_ms) for s in gauges]
    results = range_all(engine, queries)
    mine = [[s for s in series if s.labels.get("instance") == instance] for series in results]
    increases = {c: _increases(next((s.points for s in found), []), interval_ms)
                 for c, found in zip(counters, mine)}
    buckets = {h: _bucket_increases(found, interval_ms) for h, found in zip(histograms, mine[len(counters):])}
    intervals: dict[str, list[tuple[int, float | None]]] = {}
    for sig in SIGNALS:
        if sig.counter:
            intervals[sig.name] = [(t, v / step_s if v is not None else None) for t, v in increases[sig.counter]]
        elif sig.histogram:
            intervals[sig.name] = [(t, _bucket_quantile(sig.q or 0.5, by_le)) for t, by_le in buckets[sig.histogram]]
    for sig, found in zip(gauges, mine[len(counters) + len(histograms):]):
        intervals[sig.name] = [(int(t), _finite(v)) for t, v in (found[0].points if found else [])]
    intervals[ATTAINMENT], intervals[GOODPUT] = interval_values(
        buckets[TTFT_HISTOGRAM], buckets[read.tpot_histogram] if read.tpot_histogram else [],
        intervals[REQUEST_RATE], objectives, read)
    return WindowValues(whole, intervals, read)


def _samples(result: object) -> list[Any]:
    """An instant query's samples; none where it failed (a query a Prometheus refused)."""
    return result if isinstance(result, list) else []


def _by_le(samples: Iterable[Any]) -> Buckets:
    """{le: value} of one instance's bucket samples (summed by le already)."""
    out: Buckets = {}
    for s in samples:
        v = _finite(s.value)
        try:
            le = float(s.labels.get("le", ""))
        except ValueError:
            continue
        if v is not None:
            out[le] = v
    return out


def _increases(points: list[tuple[float, float | None]], interval_ms: int) -> list[tuple[int, float | None]]:
    """(interval end, counted in it) from a counter's values at consecutive boundaries; a reset gives None."""
    out: list[tuple[int, float | None]] = []
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if int(t1) - int(t0) != interval_ms:
            continue  # a boundary without a value (no sample in the lookback) leaves its intervals out
        ok = v0 is not None and v1 is not None and math.isfinite(v0) and math.isfinite(v1) and v1 >= v0
        out.append((int(t1), float(v1) - float(v0) if ok else None))
    return out


def _bucket_increases(series: list, interval_ms: int) -> list[tuple[int, dict[float, float]]]:
    """(interval end, {le: observations in it}) from a histogram's buckets at consecutive boundaries."""
    by_t: dict[int, dict[float, float]] = {}
    for s in series:
        try:
            le = float(s.labels.get("le", ""))
        except ValueError:
            continue
        for t, v in _increases(s.points, interval_ms):
            if v is not None:
                by_t.setdefault(t, {})[le] = v
    return sorted(by_t.items())


def _bucket_quantile(q: float, by_le: dict[float, float]) -> float | None:
    """histogram_quantile of one interval's bucket increases; None where no request finished in it."""
    if math.inf not in by_le or by_le[math.inf] <= 0:
        return None
    bounds = np.array(sorted(by_le))
    return _finite(bucket_quantile(q, bounds, np.array([by_le[b] for b in bounds])))


def present(values: WindowValues) -> set[str]:
    """The signals with data in the window (GPU series are absent on a CPU host, for one)."""
    return {k for k, v in values.whole.items() if v is not None} | \
        {k for k, pts in values.intervals.items() if any(v is not None for _, v in pts)}
