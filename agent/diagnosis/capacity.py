"""`capacity`: the SLO capacity point from history: the highest load that met the latency objectives.

History is binned (agent/diagnosis/capacity_bins.py: per instance and bin, request rate, tokens/s,
running requests, and the TTFT / inter-token (TPOT) / queue-time histograms). Bins are one replica's
load each, so every figure here is per replica.

Methods, named in the document:
* load levels: the bins that completed requests, grouped into LEVELS equal-width bands of request
  rate; each level's histograms are summed bucket by bucket, so its p95 is over all its requests;
* SLO point: the highest-load level meeting every objective with no level below it missing one
  (a violation at lower load ends the compliant range: the answer errs low, never high). When no
  level missed, the point is the top of the history and only a lower bound of the capacity;
* knee: the first level whose TTFT or TPOT p95 exceeds `knee_factor` x the lowest level's;
* concurrency at the SLO point by Little's law (rate x mean end-to-end latency);
* replicas for a target rate: ceil(target / SLO-point rate), flagged `extrapolated` when the target
  lies above the highest load the history holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from vllm_sentinel.agent.diagnosis.capacity_bins import Bin, Tally, merged, read_bins
from vllm_sentinel.agent.diagnosis.fix_inputs import readable
from vllm_sentinel.agent.diagnosis.routing import cdf_from_buckets, split_by_length
from vllm_sentinel.collectors.timefmt import iso_seconds

LEVELS = 8
MIN_LEVEL_REQUESTS = 20  # a p95 over fewer requests is one or two requests' luck: such levels are shown, not judged
SLO_SIGNALS = (("ttft_p95_seconds", "ttft"), ("tpot_p95_seconds", "tpot"))


class NoLoadInWindow(Exception):
    """The window holds no bin in which vLLM completed a request."""


@dataclass(frozen=True)
class CapacityQuery:
    """What `capacity` is asked: the window, the bin, the objectives, and what to plan for."""

    start_ms: int
    end_ms: int
    bin_ms: int
    ttft_slo_s: float
    tpot_slo_s: float
    slo_source: str = "rule params"
    instance: str | None = None
    target_rps: float | None = None
    knee_factor: float = 2.0
    spread_ratio: float = 4.0  # prompt-length p95 / median from which prompts count as bimodal
    itl_spike_ratio: float = 5.0  # ITL p99 / median from which long prefills stall decode

    def as_params(self) -> dict[str, Any]:
        """The query as the daemon's /v1/capacity parameters."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "CapacityQuery":
        """The query from the daemon's request parameters (strings from the wire)."""
        kinds = {"start_ms": int, "end_ms": int, "bin_ms": int, "slo_source": str, "instance": str}
        return cls(**{k: kinds.get(k, float)(v) for k, v in params.items() if k in cls.__dataclass_fields__})


def clamp_to_data(query: CapacityQuery, span: tuple[int, int] | None) -> CapacityQuery:
    """The query's window cut to the data a store holds (a `--since 30d` over an hour costs an hour);
    NoLoadInWindow when they do not meet."""
    if span is None or query.end_ms < span[0] or query.start_ms > span[1]:
        have = f"it holds {iso_seconds(span[0])} .. {iso_seconds(span[1])}" if span else "it is empty"
        raise NoLoadInWindow(f"no samples between {iso_seconds(query.start_ms)} and {iso_seconds(query.end_ms)}; "
                             f"{have}. Widen --since/--until or check --db.")
    start = max(query.start_ms, span[0] - query.bin_ms)
    return replace(query, start_ms=start, end_ms=min(query.end_ms, span[1] + query.bin_ms))


def capacity(engine: Any, query: CapacityQuery, source: str = "") -> dict:
    """capacity's document over the window: coverage, levels, SLO point, knee, replicas, routing, bins."""
    bins = [b for b in read_bins(engine, query.start_ms, query.end_ms, query.bin_ms, query.instance) if b.requests > 0]
    if not bins:
        wanted = f" for instance {query.instance}" if query.instance else ""
        raise NoLoadInWindow(f"no completed requests{wanted} (vllm:request_success_total) between "
                             f"{iso_seconds(query.start_ms)} and {iso_seconds(query.end_ms)} in "
                             f"{source or 'the source'}; widen --since/--until or check --db / --prometheus")
    levels = load_levels(bins)
    slo = slo_point(levels, query)
    observed_peak = fleet_peak(bins)
    doc = {
        "window": {"start": iso_seconds(query.start_ms), "end": iso_seconds(query.end_ms)},
        "source": source,
        "instances": sorted({b.instance for b in bins}),
        "objectives": {"ttft_p95_seconds": query.ttft_slo_s, "tpot_p95_seconds": query.tpot_slo_s,
                       "source": query.slo_source},
        "bin_seconds": query.bin_ms / 1000,
        "load": "completed requests per second per instance (vllm:request_success_total)",
        "coverage": coverage(bins, query, observed_peak),
        "levels": levels,
        "slo_point": slo,
        "knee": knee(levels, query.knee_factor),
        "replicas": replicas(slo, query.target_rps, observed_peak),
        "routing": routing(merged(bins), query),
        "methods": methods(query),
        "bins": [{"end": iso_seconds(b.end_ms), "instance": b.instance, "requests": round(b.requests, 3),
                  **b.metrics()} for b in bins],
    }
    doc["warnings"] = [w for w in (doc["coverage"]["statement"] if slo and slo["bounded_by_history"] else None,
                                   (doc["replicas"] or {}).get("warning")) if w]
    return doc


def load_levels(bins: Sequence[Bin], n: int = LEVELS) -> list[dict]:
    """The bins in `n` equal-width bands of request rate, each band's histograms summed; low load first."""
    top = max(b.rate for b in bins)
    width = top / n
    bands: dict[int, list[Bin]] = {}
    for b in bins:
        bands.setdefault(min(n - 1, int(b.rate / width)) if width > 0 else 0, []).append(b)
    out = []
    for i in sorted(bands):
        t = merged(bands[i])
        out.append({"band_per_s": [round(i * width, 6), round((i + 1) * width, 6)], "bins": len(bands[i]),
                    "requests": round(t.requests, 3), "judged": t.requests >= MIN_LEVEL_REQUESTS, **t.metrics()})
    return out


def _misses(level: dict, query: CapacityQuery) -> list[str]:
    """The objectives a level missed, as 'TTFT p95 2.4 s > 2 s'."""
    out = []
    for (key, name), slo in zip(SLO_SIGNALS, (query.ttft_slo_s, query.tpot_slo_s)):
        v = level.get(key)
        if v is not None and v > slo:
            out.append(f"{name.upper()} p95 {_s(v)} > {_s(slo)}")
    return out


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.3g} s"


def slo_point(levels: list[dict], query: CapacityQuery) -> dict | None:
    """The highest-load judged level that met every objective with none below it missing; None when the
    lowest judged level already missed (its misses are in `levels`)."""
    judged = [lv for lv in levels if lv["judged"]]
    best, first_miss = None, None
    for lv in judged:
        if _misses(lv, query):
            first_miss = lv
            break
        best = lv
    if best is None:
        return None
    margins = {}
    for (key, name), slo in zip(SLO_SIGNALS, (query.ttft_slo_s, query.tpot_slo_s)):
        v = best.get(key)
        margins[f"{name}_pct"] = None if v is None else round((slo - v) / slo * 100, 1)
    return {
        "request_rate_per_s": best["request_rate_per_s"], "tokens_per_s": best["tokens_per_s"],
        "ttft_p95_seconds": best["ttft_p95_seconds"], "tpot_p95_seconds": best["tpot_p95_seconds"],
        "queue_time_p95_seconds": best["queue_time_p95_seconds"],
        "margin": margins,
        "littles_law_concurrency": best["littles_law_concurrency"], "running_mean": best["running_mean"],
        "bounded_by_history": first_miss is None,
        "next_level": None if first_miss is None else {
            "request_rate_per_s": first_miss["request_rate_per_s"], "missed": _misses(first_miss, query)},
    }


def knee(levels: list[dict], factor: float) -> dict | None:
    """The first judged level whose TTFT or TPOT p95 exceeds `factor` x the lowest judged level's; None if none."""
    judged = [lv for lv in levels if lv["judged"]]
    if len(judged) < 2:
        return None
    base = judged[0]
    for lv in judged[1:]:
        for key, name in SLO_SIGNALS:
            if base.get(key) and lv.get(key) is not None and lv[key] > factor * base[key]:
                return {"request_rate_per_s": lv["request_rate_per_s"], "signal": key, "value": lv[key],
                        "baseline": base[key], "baseline_rate_per_s": base["request_rate_per_s"],
                        "factor": factor}
    return None


def methods(query: CapacityQuery) -> dict[str, str]:
    """Each figure's method in a sentence (the document carries them, so a reader can check the arithmetic)."""
    return {
        "load_levels": f"bins that completed requests, in {LEVELS} equal-width bands of request rate per instance; "
                       f"each band's histogram buckets summed, so its p95 is over all its requests; a band needs "
                       f"{MIN_LEVEL_REQUESTS} requests to be judged",
        "slo_point": "the highest-load level meeting every objective with no level below it missing one; with no "
                     "level missing, the top of the history (a lower bound)",
        "knee": f"the first level whose TTFT or TPOT p95 exceeds {readable(query.knee_factor)}x its value at the "
                "lowest judged level",
        "concurrency": "Little's law: request rate x mean end-to-end latency (vllm:e2e_request_latency_seconds)",
        "replicas": "ceil(target rate / the SLO point's rate per replica); extrapolated when the target is above "
                    "the highest total rate observed",
        "routing": "prompt-length p95 >= the prefill_hol_blocking spread ratio x median; cut at the 1-2-5 bucket "
                   "bound in the sparsest stretch between median and p95",
    }


def fleet_peak(bins: Sequence[Bin]) -> float:
    """The highest request rate the history holds, all instances of one bin summed."""
    per_bin: dict[int, float] = {}
    for b in bins:
        per_bin[b.end_ms] = per_bin.get(b.end_ms, 0.0) + b.rate
    return max(per_bin.values())


def coverage(bins: Sequence[Bin], query: CapacityQuery, peak: float) -> dict:
    """How much load the history covered, and the statement that nothing past it is claimed."""
    rates = [b.rate for b in bins]
    lo, hi = min(rates), max(rates)
    first, last = min(b.end_ms for b in bins) - query.bin_ms, max(b.end_ms for b in bins)
    n_inst = len({b.instance for b in bins})
    statement = (f"the history ({iso_seconds(first)} .. {iso_seconds(last)}, {len(bins)} bins of "
                 f"{readable(query.bin_ms / 1000)} s with completed requests on {n_inst} instance(s)) covers "
                 f"{readable(round(lo, 3))} .. {readable(round(hi, 3))} requests/s per instance"
                 f"{f' ({readable(round(peak, 3))}/s all instances at once)' if n_inst > 1 else ''}; "
                 "nothing above that was observed, so no figure here is measured past it")
    return {"start": iso_seconds(first), "end": iso_seconds(last), "bins": len(bins),
            "request_rate_min_per_s": round(lo, 6), "request_rate_max_per_s": round(hi, 6),
            "fleet_request_rate_max_per_s": round(peak, 6), "statement": statement}


def replicas(slo: dict | None, target_rps: float | None, observed_peak: float) -> dict | None:
    """Replicas that carry `target_rps` at the SLO point's per-replica rate; extrapolation flagged."""
    if target_rps is None:
        return None
    out: dict[str, Any] = {"target_rate_per_s": target_rps, "replicas": None, "per_replica_rate_per_s": None,
                           "extrapolated": target_rps > observed_peak, "warning": None}
    if slo is None or not slo["request_rate_per_s"]:
        out["warning"] = "no load level met the objectives: no per-replica rate to plan with"
        return out
    per = slo["request_rate_per_s"]
    out.update(replicas=max(1, math.ceil(target_rps / per - 1e-9)), per_replica_rate_per_s=per)
    notes = []
    if out["extrapolated"]:
        notes.append(f"extrapolated: the target {readable(target_rps)}/s is above the highest load observed "
                     f"({readable(round(observed_peak, 3))}/s); replicas assume each carries the SLO point's "
                     f"{readable(per)}/s, which this history has not shown at that total")
    if slo["bounded_by_history"]:
        notes.append("no load level missed the objectives, so the per-replica rate is a lower bound and "
                     f"{out['replicas']} replicas an upper bound")
    out["warning"] = "; ".join(notes) or None
    return out


def routing(whole: Tally, query: CapacityQuery) -> dict | None:
    """The length split when prompts were bimodal over the window (else None), with whether decode stalled."""
    by_le = whole.buckets.get("prompt") or {}
    if not by_le:
        return None
    bounds = sorted(by_le)
    split = split_by_length(cdf_from_buckets(bounds, [by_le[b] for b in bounds]), query.spread_ratio)
    if split is None:
        return None
    p99, p50 = whole.quantile("tpot", 0.99), whole.quantile("tpot", 0.5)
    ratio = round(p99 / p50, 2) if p99 is not None and p50 else None
    return {**split.as_dict(), "summary": split.summary(), "itl_p99_over_p50": ratio,
            "prefill_blocking_seen": ratio is not None and ratio > query.itl_spike_ratio}
