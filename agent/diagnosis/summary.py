"""Per-instance health over a window, from counters and histograms (PromQL over the store)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vllm_sentinel.agent.promql.engine import Engine, PromQLError
from vllm_sentinel.agent.promql.remote import instant_all, range_all
from vllm_sentinel.agent.store import rollups
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.events_table import last_scrape_errors
from vllm_sentinel.agent.store.sample_reads import instances_with_samples
from vllm_sentinel.agent.store.series_table import series_count_by_instance


def _quantile(q: float, histogram: str) -> str:
    """PromQL for the q-quantile of a vLLM histogram over the window, per instance."""
    return f"histogram_quantile({q}, sum by (instance, le) (increase(vllm:{histogram}_bucket[{{w}}s])))"


# name (its unit in its suffix) -> PromQL with {w} = window in seconds; every expression keeps `instance`.
# Counters and histograms over the whole window, not instantaneous gauges: on a busy host the API
# server answers /metrics between engine steps, so gauges often read 0 under load.
SIGNALS: dict[str, str] = {
    "scrapes": "sum by (instance) (count_over_time(up[{w}s]))",
    "scrapes_ok": "sum by (instance) (sum_over_time(up[{w}s]))",
    "scrape_duration_avg_seconds": "avg by (instance) (avg_over_time(scrape_duration_seconds[{w}s]))",
    "request_rate_per_s": "sum by (instance) (increase(vllm:request_success_total[{w}s])) / {w}",
    "requests_finished": "sum by (instance) (increase(vllm:request_success_total[{w}s]))",
    "prompt_tokens_per_s": "sum by (instance) (increase(vllm:prompt_tokens_total[{w}s])) / {w}",
    "generation_tokens_per_s": "sum by (instance) (increase(vllm:generation_tokens_total[{w}s])) / {w}",
    "queue_time_p50_seconds": _quantile(0.5, "request_queue_time_seconds"),
    "queue_time_p95_seconds": _quantile(0.95, "request_queue_time_seconds"),
    "ttft_p50_seconds": _quantile(0.5, "time_to_first_token_seconds"),
    "ttft_p95_seconds": _quantile(0.95, "time_to_first_token_seconds"),
    "itl_p50_seconds": _quantile(0.5, "inter_token_latency_seconds"),
    "itl_p95_seconds": _quantile(0.95, "inter_token_latency_seconds"),
    "e2e_p95_seconds": _quantile(0.95, "e2e_request_latency_seconds"),
    "kv_cache_usage_peak": "max by (instance) (max_over_time(vllm:kv_cache_usage_perc[{w}s]))",  # ratio
    "preemptions": "sum by (instance) (increase(vllm:num_preemptions_total[{w}s]))",
    "running_peak": "max by (instance) (max_over_time(vllm:num_requests_running[{w}s]))",
    "waiting_peak": "max by (instance) (max_over_time(vllm:num_requests_waiting[{w}s]))",
    "gpu_util_avg_percent": "avg by (instance) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[{w}s]))",
    "gpu_fb_used_peak_mib": "max by (instance) (max_over_time(DCGM_FI_DEV_FB_USED[{w}s]))",
}


# signals drawn as sparklines over the window: name -> PromQL with {s} = step in seconds
TRENDS: dict[str, str] = {
    "request_rate_per_s": "sum by (instance) (rate(vllm:request_success_total[{s}s]))",
    "generation_tokens_per_s": "sum by (instance) (rate(vllm:generation_tokens_total[{s}s]))",
    "ttft_p95_seconds": "histogram_quantile(0.95, sum by (instance, le) "
                        "(rate(vllm:time_to_first_token_seconds_bucket[{s}s])))",
    "queue_time_p95_seconds": "histogram_quantile(0.95, sum by (instance, le) "
                              "(rate(vllm:request_queue_time_seconds_bucket[{s}s])))",
    "kv_cache_usage_peak": "max by (instance) (max_over_time(vllm:kv_cache_usage_perc[{s}s]))",
    "preemptions_per_s": "sum by (instance) (rate(vllm:num_preemptions_total[{s}s]))",
    "gpu_util_percent": "avg by (instance) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[{s}s]))",
}
TREND_POINTS = 40


@dataclass
class InstanceSummary:
    """What happened on one instance in the window."""

    instance: str
    series: int
    signals: dict[str, float | None]
    last_error: str | None = None
    trends: dict[str, list[float | None]] = field(default_factory=dict)  # up to TREND_POINTS values each

    def as_dict(self) -> dict:
        """JSON-ready form (NaN becomes null)."""
        return {"instance": self.instance, "series": self.series, "last_error": self.last_error,
                "signals": {k: _finite(v) for k, v in self.signals.items()},
                "trends": {k: [_finite(v) for v in vs] for k, vs in self.trends.items()}}


def _finite(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) or math.isinf(v) else round(v, 6)


def health_summary(store: Store, start_ms: int, end_ms: int, instance: str | None = None,
                   engine: Engine | None = None, seen: list[str] | None = None) -> list[InstanceSummary]:
    """One InstanceSummary per instance seen in (start_ms, end_ms] (`seen`, when the caller already listed
    them); `engine` (default: raw samples only) may read the store's rollups, which its rollups_used then says."""
    if seen is None:
        seen = instances_with_samples(store, start_ms, end_ms)
    names = [i for i in seen if instance is None or i == instance]
    if not names:
        return []
    return summaries(engine or Engine(store), names, start_ms, end_ms, series_count_by_instance(store),
                     last_scrape_errors(store, start_ms, end_ms))


def summaries(engine: Any, names: list[str], start_ms: int, end_ms: int, counts: dict[str, int],
              errors: dict[str, str]) -> list[InstanceSummary]:
    """The InstanceSummary of each of `names` over (start_ms, end_ms], from any PromQL engine (store or remote)."""
    window_s = max(1, (end_ms - start_ms) // 1000)
    per: dict[str, dict[str, float | None]] = {n: {} for n in names}
    keys = list(SIGNALS)
    results = _each_or_empty(engine, [(SIGNALS[k].format(w=window_s), end_ms) for k in keys])
    for key, result in zip(keys, results):
        for sample in result if isinstance(result, list) else []:
            inst = sample.labels.get("instance")
            if inst in per:
                per[inst][key] = sample.value
    trends = _trends(engine, start_ms, end_ms, names)
    return [InstanceSummary(n, counts.get(n, 0), {k: per[n].get(k) for k in SIGNALS}, errors.get(n), trends[n])
            for n in names]


def _each_or_empty(engine: Any, queries: list[tuple[str, int]]) -> list[Any]:
    """The instant queries' results in order, all at once where the engine can; a failing one reads as empty."""
    try:
        return instant_all(engine, queries)
    except PromQLError:
        pass
    out: list[Any] = []
    for q in queries:
        try:
            out.append(engine.instant(*q))
        except PromQLError:
            out.append([])
    return out


def _trends(engine: Any, start_ms: int, end_ms: int, names: list[str]) -> dict[str, dict[str, list]]:
    """Up to TREND_POINTS values per signal and instance, each over its own step (None where no data)."""
    step_ms = max(1000, (end_ms - start_ms) // TREND_POINTS)
    last, points = end_ms, TREND_POINTS
    if getattr(engine, "rollups", False) and step_ms > rollups.BLOCK_MS:
        # points on the rollups' block grid, each over whole blocks, so a long window's trend reads rollups
        # instead of every sample: steps rounded up to whole blocks (fewer points), the last point at the
        # last block boundary of the window
        block = rollups.BLOCK_MS
        step_ms, last = -(-step_ms // block) * block, end_ms // block * block
        points = max(1, min(TREND_POINTS, (last - start_ms) // step_ms))
    # a rate needs at least two scrapes inside its window; 1 s scrapes make 15 s the smallest useful one
    step_s = max(15, step_ms // 1000)
    times = [last - (points - 1 - i) * step_ms for i in range(points)]
    out: dict[str, dict[str, list]] = {n: {} for n in names}
    keys = list(TRENDS)
    queries = [(TRENDS[k].format(s=step_s), times[0], times[-1], step_ms) for k in keys]
    try:
        results = range_all(engine, queries)
    except PromQLError:
        results = []
        for q in queries:
            try:
                results.append(engine.range(*q))
            except PromQLError:
                results.append([])
    for key, result in zip(keys, results):
        for series in result:
            inst = series.labels.get("instance")
            if inst in out:
                at = dict(series.points)
                out[inst][key] = [at.get(t) for t in times]
    return out
