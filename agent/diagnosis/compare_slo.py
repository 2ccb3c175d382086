"""SLO attainment and goodput for `compare`, read from vLLM's latency histograms.

Attainment is the share of requests that met the objectives: the share of TTFT observations at or
under the TTFT objective and the share of per-request TPOT observations (the inter-token latency
histogram where vLLM has no per-request one) at or under the TPOT objective, the smaller of the
two. The smaller of two marginal shares bounds the share that met both from above: a request can
meet one objective and miss the other. Goodput is the request rate times attainment.

A histogram only counts observations up to each bucket bound, so a share is read at the bound equal
to the objective, or at the largest bound under it (2 s between le=1.0 and le=2.5 reads le=1.0):
requests between that bound and the objective count as missed, never the other way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
# per request first; the per-token inter-token latency where vLLM has no per-request TPOT
TPOT_HISTOGRAMS = ("vllm:request_time_per_output_token_seconds", "vllm:inter_token_latency_seconds")
SLO_HISTOGRAMS = (TTFT_HISTOGRAM,) + TPOT_HISTOGRAMS
ATTAINMENT = "slo_attainment"
GOODPUT = "goodput_rps"
TARGET_SHARE = 0.95  # a p95 objective is met where at least this share of requests met it
_SAME_BOUND = 1e-9  # an objective of 0.1 from a flag and le="0.1" parsed are the same bound

Buckets = dict[float, float]  # {le: observations at or under le}, +Inf included


@dataclass(frozen=True)
class Objectives:
    """The latency objectives requests are judged by, in seconds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1


@dataclass(frozen=True)
class SloReading:
    """How one side's attainment is read: which TPOT histogram, and the bound each objective is read at."""

    ttft: bool  # the TTFT histogram has series on this side
    tpot_histogram: str | None  # None: neither TPOT histogram has series
    ttft_bound: float | None  # None: every bound is above the objective (nothing counts as met)
    tpot_bound: float | None

    @property
    def readable(self) -> bool:
        """Whether any histogram is there to read attainment from."""
        return self.ttft or self.tpot_histogram is not None


def bound_under(bounds: Iterable[float], objective: float) -> float | None:
    """The largest finite bucket bound at or under `objective`; None when every bound is above it."""
    under = [b for b in bounds if math.isfinite(b) and b <= objective * (1 + _SAME_BOUND)]
    return max(under) if under else None


def share_under(buckets: Buckets, objective: float) -> float | None:
    """The share of observations at or under `objective` (read at bound_under); None without observations."""
    total = buckets.get(math.inf)
    if total is None or total <= 0:
        return None
    bound = bound_under(buckets, objective)
    met = buckets.get(bound, 0.0) if bound is not None else 0.0
    return min(1.0, max(0.0, met / total))


def reading(whole: dict[str, Buckets], objectives: Objectives) -> SloReading:
    """The reading of one side from its whole-window buckets: the TPOT histogram with observations first."""
    tpot = next((h for h in TPOT_HISTOGRAMS if whole.get(h, {}).get(math.inf, 0) > 0), None) or \
        next((h for h in TPOT_HISTOGRAMS if whole.get(h)), None)
    ttft = bool(whole.get(TTFT_HISTOGRAM))
    return SloReading(ttft, tpot, bound_under(whole.get(TTFT_HISTOGRAM, {}), objectives.ttft_s) if ttft else None,
                      bound_under(whole[tpot], objectives.tpot_s) if tpot else None)


def attainment(ttft: Buckets, tpot: Buckets, objectives: Objectives) -> float | None:
    """The smaller of the TTFT and TPOT shares that met their objectives (the one with observations, if one)."""
    shares = [s for s in (share_under(ttft, objectives.ttft_s), share_under(tpot, objectives.tpot_s))
              if s is not None]
    return min(shares) if shares else None


def goodput(rate: float | None, share: float | None, read: SloReading) -> float | None:
    """Requests per second that met the objectives; 0 where none finished, None where nothing is readable."""
    if rate is None or not read.readable:
        return None
    if rate == 0:
        return 0.0
    return None if share is None else rate * share


def side_values(whole: dict[str, Buckets], rate: float | None, objectives: Objectives) -> tuple[SloReading,
                                                                                                  float | None,
                                                                                                  float | None]:
    """(reading, attainment, goodput) of one side over its whole window."""
    read = reading(whole, objectives)
    share = attainment(whole.get(TTFT_HISTOGRAM, {}), whole.get(read.tpot_histogram or "", {}), objectives)
    return read, share, goodput(rate, share, read)


def interval_values(ttft: list[tuple[int, Buckets]], tpot: list[tuple[int, Buckets]],
                    rates: list[tuple[int, float | None]], objectives: Objectives,
                    read: SloReading) -> tuple[list[tuple[int, float | None]], list[tuple[int, float | None]]]:
    """Per interval end: attainment and goodput, from each interval's bucket increases and request rate."""
    by_ttft, by_tpot, by_rate = dict(ttft), dict(tpot), dict(rates)
    shares: list[tuple[int, float | None]] = []
    goods: list[tuple[int, float | None]] = []
    for t in sorted(set(by_ttft) | set(by_tpot) | set(by_rate)):
        share = attainment(by_ttft.get(t, {}), by_tpot.get(t, {}), objectives) if read.readable else None
        shares.append((t, share))
        goods.append((t, goodput(by_rate.get(t), share, read)))
    return shares, goods


def seconds_text(s: float) -> str:
    """2.0 -> '2 s', 0.1 -> '100 ms'."""
    return f"{s:g} s" if s >= 1 else f"{s * 1000:g} ms"


def _read_text(what: str, histogram: str, bound: float | None, objective: float) -> str:
    """How one share was read, e.g. 'TTFT read at le=1.0, the bound under 2 s (conservative; vllm:...)'."""
    if bound is None:
        return f"{what}: no bucket bound at or under {seconds_text(objective)}, none counted as met ({histogram})"
    if bound >= objective * (1 - _SAME_BOUND):
        return f"{what} read at le={float(bound)!r} ({histogram})"
    return f"{what} read at le={float(bound)!r}, the bound under {seconds_text(objective)} (conservative; {histogram})"


def _side_text(read: SloReading, objectives: Objectives) -> str:
    """The shares one side's attainment was read from, in words."""
    parts = []
    if read.ttft:
        parts.append(_read_text("TTFT", TTFT_HISTOGRAM, read.ttft_bound, objectives.ttft_s))
    if read.tpot_histogram:
        kind = "per-request TPOT" if read.tpot_histogram == TPOT_HISTOGRAMS[0] else \
            "TPOT as inter-token latency (per token, no per-request histogram)"
        parts.append(_read_text(kind, read.tpot_histogram, read.tpot_bound, objectives.tpot_s))
    return "; ".join(parts) if parts else "no TTFT or TPOT histogram: attainment and goodput unknown"


def method_text(objectives: Objectives, source: str, before: SloReading, after: SloReading) -> str:
    """The method of the `slo` block: what attainment and goodput are and how each side was read."""
    sides = _side_text(before, objectives)
    if after != before:
        sides = f"before: {sides}; after: {_side_text(after, objectives)}"
    return (f"objectives TTFT p95 < {seconds_text(objectives.ttft_s)}, TPOT p95 < {seconds_text(objectives.tpot_s)} "
            f"({source}); attainment: the smaller of the shares of TTFT and TPOT observations at or under their "
            f"objectives, an upper bound of the share of requests that met both (read from two marginal "
            f"histograms); the p95 objectives hold where it is {TARGET_SHARE:g} or more; goodput: finished requests "
            f"per second (vllm:request_success_total) x attainment; {sides}")


def slo_block(objectives: Objectives, source: str, readings: tuple[SloReading, SloReading],
              shares: tuple[float | None, float | None], goods: tuple[float | None, float | None]) -> dict:
    """The document's `slo` block: objectives, attainment and goodput before and after, and the method."""
    def rounded(v: float | None) -> float | None:
        return None if v is None else round(v, 6)

    return {"ttft_p95_s": objectives.ttft_s, "tpot_p95_s": objectives.tpot_s,
            "attainment": {"before": rounded(shares[0]), "after": rounded(shares[1])},
            "goodput_rps": {"before": rounded(goods[0]), "after": rounded(goods[1])},
            "method": method_text(objectives, source, *readings)}
