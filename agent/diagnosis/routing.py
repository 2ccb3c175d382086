"""Length-based routing advice: when prompt lengths are bimodal, a short pool and a long pool split at a cut-point.

The input is the prompt-length distribution as points of its cumulative distribution, either the
histogram's buckets (`vllm:request_prompt_tokens_bucket`: upper bounds with cumulative counts) or
quantiles read from it (an incident's evidence, p25 .. p99). Both are the same thing to this module:
(tokens, fraction of prompts at or below) pairs, interpolated linearly between points as
histogram_quantile does.

Bimodal means a long tail: the p95 prompt is `spread_ratio` times the median or more. The cut sits
in the density valley between the two modes: among the stretches of the distribution between the
median and the p95, the one holding the fewest prompts per log-unit of length (a run of empty
buckets in a histogram of short and long prompts), at the 1-2-5 value nearest its log-middle: vLLM's
prompt-length buckets are that 1-2-5 ladder, so on histogram data the cut is a bucket bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from vllm_sentinel.agent.diagnosis.fix_inputs import MAX_BATCHED_TOKENS, readable, round_down, round_up

CdfPoints = Sequence[tuple[float, float]]  # (prompt tokens, fraction of prompts <= it), ascending
TAIL_Q = 0.95
MIN_POOL_SHARE = 0.02  # a pool that would take under 2% of requests is not worth a replica of its own
_TIE = 1.05  # stretches within 5% of the sparsest one are the same valley


@dataclass
class Pool:
    """One pool of the split: which prompts go there and the engine settings for it."""

    prompts: str
    share_of_requests: float
    share_of_prompt_tokens: float
    max_num_batched_tokens: int
    long_prefill_token_threshold: int

    def flags(self) -> str:
        """The pool's engine flags as they go on a command line."""
        return (f"--max-num-batched-tokens {self.max_num_batched_tokens} "
                f"--long-prefill-token-threshold {self.long_prefill_token_threshold}")


@dataclass
class LengthSplit:
    """Route prompts of up to `cut_tokens` to the short pool, longer ones to the long pool."""

    cut_tokens: int
    median_tokens: float
    tail_tokens: float
    tail_ratio: float
    short: Pool
    long: Pool
    method: str
    effect: str

    def as_dict(self) -> dict:
        """JSON-ready (the `routing` section of capacity's document)."""
        return asdict(self)

    def summary(self) -> str:
        """One line: 'prompts <= 200 tokens -> short pool (--max-num-batched-tokens 512 ...); longer -> ...'."""
        return (f"prompts <= {readable(self.cut_tokens)} tokens -> short pool ({self.short.flags()}); "
                f"longer -> long pool ({self.long.flags()})")


def cdf_from_buckets(bounds: Sequence[float], cumulative: Sequence[float]) -> list[tuple[float, float]]:
    """Histogram buckets (le, cumulative count) as CDF points; +Inf stands at the last finite bound.

    cdf_from_buckets([10, 100, inf], [5, 5, 10]) -> [(0.0, 0.0), (10, 0.5), (100, 0.5), (100, 1.0)]
    """
    pairs = sorted(zip(bounds, cumulative))
    total = pairs[-1][1] if pairs else 0.0
    if total <= 0:
        return []
    finite = [b for b, _ in pairs if math.isfinite(b)]
    top = finite[-1] if finite else 1.0
    out = [(0.0, 0.0)]
    for b, c in pairs:
        out.append((b if math.isfinite(b) else top, max(out[-1][1], min(1.0, c / total))))
    return out


def cdf_from_quantiles(quantiles: Mapping[float, float | None]) -> list[tuple[float, float]]:
    """Quantiles {q: tokens} (from histogram_quantile) as CDF points; the mass above the top one stands at it.

    cdf_from_quantiles({0.5: 40, 0.95: 2000}) -> [(0.0, 0.0), (40, 0.5), (2000, 0.95), (2000, 1.0)]
    """
    known = sorted((q, float(x)) for q, x in quantiles.items() if x is not None and math.isfinite(x))
    if not known:
        return []
    out = [(0.0, 0.0)]
    for q, x in known:
        out.append((max(x, out[-1][0]), q))
    return out + [(out[-1][0], 1.0)]


def quantile(points: CdfPoints, q: float) -> float:
    """The q-quantile of the CDF points, interpolated linearly (as histogram_quantile)."""
    for (x0, f0), (x1, f1) in zip(points, points[1:]):
        if f1 >= q and f1 > f0:
            return x0 + (x1 - x0) * (q - f0) / (f1 - f0)
    return points[-1][0]


def share_at_or_below(points: CdfPoints, x: float) -> float:
    """The fraction of prompts of at most x tokens."""
    for (x0, f0), (x1, f1) in zip(points, points[1:]):
        if x <= x1:
            return f1 if x1 == x0 else f0 + (f1 - f0) * (x - x0) / (x1 - x0)
    return 1.0


def _valley(points: CdfPoints, lo: float, hi: float) -> tuple[float, float] | None:
    """The sparsest stretch (prompts per log-unit of length) between lo and hi, widened over its ties."""
    stretches: list[tuple[float, float, float]] = []  # (start, end, density)
    for (x0, f0), (x1, f1) in zip(points, points[1:]):
        a, b = max(x0, lo), min(x1, hi)
        if a <= 0 or b <= a * 1.0001:
            continue
        mass = (f1 - f0) * (b - a) / (x1 - x0)
        stretches.append((a, b, mass / math.log(b / a)))
    if not stretches:
        return None
    sparsest = min(d for _, _, d in stretches)
    i = next(k for k, s in enumerate(stretches) if s[2] == sparsest)
    j = i
    while i > 0 and stretches[i - 1][2] <= sparsest * _TIE + 1e-12:
        i -= 1
    while j + 1 < len(stretches) and stretches[j + 1][2] <= sparsest * _TIE + 1e-12:
        j += 1
    return stretches[i][0], stretches[j][1]


def ladder_125(lo: float, hi: float) -> list[int]:
    """The 1-2-5 values (vLLM's prompt-length bucket bounds) in [lo, hi]: ladder_125(60, 600) -> [100, 200, 500]."""
    out, decade = [], 1
    while decade <= hi:
        out += [v for v in (decade, 2 * decade, 5 * decade) if lo <= v <= hi]
        decade *= 10
    return out


def _cut(lo: float, hi: float) -> int:
    """The 1-2-5 value nearest the log-middle of [lo, hi] (ties: the lower one); else the middle itself."""
    middle = math.sqrt(lo * hi)
    nice = ladder_125(lo, hi)
    if not nice:
        return max(1, round(middle))
    return min(nice, key=lambda v: (round(abs(math.log(v / middle)), 9), v))


def _token_shares(points: CdfPoints, cut: float) -> float:
    """The short pool's share of prompt tokens: each stretch's prompts at its log-middle length."""
    short = total = 0.0
    for (x0, f0), (x1, f1) in zip(points, points[1:]):
        mass = f1 - f0
        if mass <= 0:
            continue
        mid = x1 / 2 if x0 <= 0 else math.sqrt(x0 * x1)
        total += mass * mid
        if x1 <= cut:
            short += mass * mid
    return short / total if total > 0 else 0.0


def split_by_length(points: CdfPoints, spread_ratio: float, *, budget: int | None = None,
                    block_size: int = 16, min_budget: int = 512) -> LengthSplit | None:
    """The short/long split when prompts are bimodal (p95 >= spread_ratio x median), else None.

    `budget` is the current --max-num-batched-tokens (the long pool never gets less), `min_budget`
    the least a pool may have (vLLM needs at least max_num_seqs).
    """
    if len(points) < 3:
        return None
    median, tail = quantile(points, 0.5), quantile(points, TAIL_Q)
    if median <= 0 or tail < spread_ratio * median:
        return None
    valley = _valley(points, median, tail)
    if valley is None:
        return None
    cut = _cut(*valley)
    short_share = share_at_or_below(points, cut)
    if min(short_share, 1 - short_share) < MIN_POOL_SHARE:
        return None
    short_tokens = _token_shares(points, cut)
    # the short pool prefills any of its prompts in one step; a stray long prompt is chunked at the cut
    short = Pool(f"<= {cut} tokens", round(short_share, 4), round(short_tokens, 4),
                 max(min_budget, round_up(cut, 256)), cut)
    # the long pool holds its p95 prompt in one step (at most vLLM's practical maximum), and a quarter of
    # the step per long prompt leaves room for the decodes of the others (as the prefill_hol_blocking fix)
    long_budget = min(MAX_BATCHED_TOKENS, max(budget or 0, min_budget, round_up(tail, 1024)))
    long = Pool(f"> {cut} tokens", round(1 - short_share, 4), round(1 - short_tokens, 4),
                long_budget, round_down(long_budget / 4, block_size))
    method = (f"prompt-length p95 {readable(round(tail))} tokens is {tail / median:.1f}x the median "
              f"{readable(round(median))} (bimodal at >= {readable(spread_ratio)}x); cut at the 1-2-5 bucket bound "
              f"nearest the log-middle of the sparsest stretch between median and p95 "
              f"({readable(round(valley[0]))}..{readable(round(valley[1]))} tokens)")
    effect = (f"{short_share:.0%} of requests (prompts <= {readable(cut)} tokens) stop sharing engine steps with "
              f"prompts of up to {readable(round(tail))} tokens (p95): the longest prefill in their steps drops from "
              f"{readable(round(tail))} to {readable(cut)} tokens ({tail / cut:.0f}x less), so their TTFT no longer "
              f"waits behind long prefills and their inter-token latency loses the long-prefill spikes; the long pool "
              f"takes {1 - short_share:.0%} of requests but {1 - short_tokens:.0%} of prompt tokens: size the pools' "
              "replicas by prompt tokens, not requests")
    return LengthSplit(cut, round(median, 1), round(tail, 1), round(tail / median, 2), short, long, method, effect)
