"""History in time bins for `capacity`: per instance and bin, the load served and the latency histograms.

Every value comes from vLLM's counters and histograms (increase() over the bin), never from a
sampled gauge moment, except the running/waiting means (avg_over_time). The queries run on any
engine (the store's Engine or a RemoteEngine), one range query per family with step = the bin, so
the point at t covers the bin (t - bin, t].
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_sentinel.agent.promql.functions import bucket_quantile
from vllm_sentinel.agent.promql.remote import range_all
from vllm_sentinel.collectors.timefmt import format_prometheus_duration_ms

COUNTERS = {"requests": "vllm:request_success_total", "prompt_tokens": "vllm:prompt_tokens_total",
            "generation_tokens": "vllm:generation_tokens_total",
            "e2e_sum": "vllm:e2e_request_latency_seconds_sum", "e2e_count": "vllm:e2e_request_latency_seconds_count"}
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
# latency families are the SLO signals (TPOT is vLLM's inter-token latency); prompt lengths feed routing
HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "tpot": "vllm:inter_token_latency_seconds",
              "queue": "vllm:request_queue_time_seconds", "prompt": "vllm:request_prompt_tokens"}


@dataclass
class Tally:
    """What a stretch of history served: counter increases, gauge means and summed histogram buckets."""

    seconds: float = 0.0
    increases: dict[str, float] = field(default_factory=dict)  # COUNTERS key -> increase over the stretch
    # GAUGES key -> the gauge integrated over the stretch (running x seconds: a mean once divided by `seconds`)
    gauge_seconds: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # family -> le -> cumulative count

    def add(self, other: "Tally") -> None:
        """Fold another stretch into this one (its counters, gauges and buckets summed per key)."""
        self.seconds += other.seconds
        _add_into(self.increases, other.increases)
        _add_into(self.gauge_seconds, other.gauge_seconds)
        for family, by_le in other.buckets.items():
            _add_into(self.buckets.setdefault(family, {}), by_le)

    @property
    def requests(self) -> float:
        """Requests completed over the stretch."""
        return self.increases.get("requests", 0.0)

    @property
    def rate(self) -> float:
        """Completed requests per second."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def quantile(self, family: str, q: float) -> float | None:
        """The q-quantile of a histogram family over this stretch (histogram_quantile), None without observations."""
        by_le = self.buckets.get(family)
        if not by_le or math.inf not in by_le or by_le[math.inf] <= 0:
            return None
        bounds = np.array(sorted(by_le))
        v = bucket_quantile(q, bounds, np.array([by_le[b] for b in bounds]))
        return None if math.isnan(v) else float(v)

    def metrics(self) -> dict[str, float | None]:
        """Load and latency of this stretch, by the names capacity's document uses."""
        inc, secs = self.increases, self.seconds
        e2e_count = inc.get("e2e_count", 0.0)
        e2e_mean = inc.get("e2e_sum", 0.0) / e2e_count if e2e_count > 0 else None
        tokens = inc.get("prompt_tokens", 0.0) + inc.get("generation_tokens", 0.0)
        return {
            "request_rate_per_s": _r(self.rate),
            "tokens_per_s": _r(tokens / secs) if secs else None,
            "running_mean": _r(self.gauge_seconds.get("running", 0.0) / secs) if secs else None,
            "waiting_mean": _r(self.gauge_seconds.get("waiting", 0.0) / secs) if secs else None,
            "ttft_p95_seconds": _r(self.quantile("ttft", 0.95)),
            "tpot_p95_seconds": _r(self.quantile("tpot", 0.95)),
            "queue_time_p95_seconds": _r(self.quantile("queue", 0.95)),
            "e2e_mean_seconds": _r(e2e_mean),
            # Little's law: requests in the system = arrival rate x mean time in it
            "littles_law_concurrency": _r(self.rate * e2e_mean) if e2e_mean is not None else None,
        }


@dataclass
class Bin(Tally):
    """One instance's tally over one bin (end_ms - bin, end_ms]."""

    instance: str = ""
    end_ms: int = 0


def _add_into(into: dict[Any, float], other: dict[Any, float]) -> None:
    # sums per key: counter increases, gauge seconds, or one family's bucket counts by bound
    for key, v in other.items():
        into[key] = into.get(key, 0.0) + v


def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)


@dataclass(frozen=True)
class Families:
    """What a bin reads: counters (increase), gauges (mean) and histograms (bucket increases), by field name."""

    counters: dict[str, str]
    gauges: dict[str, str]
    histograms: dict[str, str]


CAPACITY = Families(COUNTERS, GAUGES, HISTOGRAMS)


def bin_queries(bin_ms: int, families: Families = CAPACITY) -> list[tuple[str, str, str]]:
    """(kind, field or family, PromQL) for one bin width: counters, gauges, then histograms by bound."""
    w = format_prometheus_duration_ms(bin_ms)
    out = [("counter", k, f"sum by (instance) (increase({m}[{w}]))") for k, m in families.counters.items()]
    out += [("gauge", k, f"sum by (instance) (avg_over_time({m}[{w}]))") for k, m in families.gauges.items()]
    out += [("histogram", k, f"sum by (instance, le) (increase({m}_bucket[{w}]))")
            for k, m in families.histograms.items()]
    return out


def bin_ends(start_ms: int, end_ms: int, bin_ms: int) -> tuple[int, int]:
    """The first and last bin end in (start_ms, end_ms], on multiples of the bin (the same bins on a rerun)."""
    first = -(-(start_ms + bin_ms) // bin_ms) * bin_ms
    return first, end_ms // bin_ms * bin_ms


def read_bins(engine: Any, start_ms: int, end_ms: int, bin_ms: int, instance: str | None = None,
              families: Families = CAPACITY) -> list[Bin]:
    """Every (instance, bin) of the window that holds vLLM series, in time order."""
    first, last = bin_ends(start_ms, end_ms, bin_ms)
    if last < first:
        return []
    return _tallied(engine, first, last, bin_ms, instance, families)


def read_span(engine: Any, start_ms: int, end_ms: int, instance: str | None = None,
              families: Families = CAPACITY) -> list[Bin]:
    """One bin per instance over exactly (start_ms, end_ms]: each counter's increase across the whole span, so
    a scrape gap longer than a bin loses nothing (summed bins lose the increase no bin holds two samples of)."""
    return _tallied(engine, end_ms, end_ms, end_ms - start_ms, instance, families) if end_ms > start_ms else []


def _tallied(engine: Any, first: int, last: int, bin_ms: int, instance: str | None, families: Families) -> list[Bin]:
    queries = bin_queries(bin_ms, families)
    results = range_all(engine, [(q, first, last, bin_ms) for _, _, q in queries])
    bins: dict[tuple[str, int], Bin] = {}
    for (kind, name, _), series in zip(queries, results):
        for s in series:
            inst = s.labels.get("instance", "")
            if instance is not None and inst != instance:
                continue
            for t, v in s.points:
                if v is None or not math.isfinite(v):
                    continue
                b = bins.setdefault((inst, int(t)), Bin(seconds=bin_ms / 1000, instance=inst, end_ms=int(t)))
                _put(b, kind, name, s.labels, float(v))
    return sorted(bins.values(), key=lambda b: (b.end_ms, b.instance))


def _put(b: Bin, kind: str, name: str, labels: dict[str, str], v: float) -> None:
    if kind == "counter":
        b.increases[name] = max(0.0, v)
    elif kind == "gauge":
        b.gauge_seconds[name] = v * b.seconds
    else:
        le = _le(labels.get("le"))
        if le is not None:
            b.buckets.setdefault(name, {})[le] = max(0.0, v)


def _le(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def merged(tallies: Iterable[Tally]) -> Tally:
    """One tally of many (a load level, or the whole history)."""
    out = Tally()
    for t in tallies:
        out.add(t)
    return out
