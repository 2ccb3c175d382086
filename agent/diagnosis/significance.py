"""Is a before/after difference larger than the noise? A two-sided Mann-Whitney U test, numpy only.

The samples are per-interval values of one signal (a p95 per 30 s, preemptions per second per 30 s)
on each side of a change. Mann-Whitney compares the two sets by ranks, so it needs no normal
distribution and one outlier interval cannot carry it; with ties (rates at 0) the variance is
corrected for them. The normal approximation with continuity correction is used: conservative
where the sides separate fully (p 0.0009 at 8 intervals a side, where the exact p is 0.0002), and
fewer than MIN_INTERVALS a side are never called significant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.01  # adjacent intervals are not independent (queues carry over): stricter than the habitual 0.05
MIN_INTERVALS = 5  # per side; below it even a total separation reads p > 0.01


@dataclass(frozen=True)
class Test:
    """The outcome of one comparison: p-value (None when not tested), and whether it is significant."""

    p_value: float | None
    significant: bool
    n_before: int
    n_after: int


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank: [10, 20, 20, 5] -> [2, 3.5, 3.5, 1]."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def mann_whitney_p(before: Sequence[float], after: Sequence[float]) -> float:
    """Two-sided p-value of Mann-Whitney U (normal approximation, tie and continuity corrected).

    mann_whitney_p([1, 2, 3, 4, 5, 6, 7, 8], [11, 12, 13, 14, 15, 16, 17, 18]) -> about 0.0009;
    identical samples -> 1.0.
    """
    x, y = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return 1.0
    both = np.concatenate([x, y])
    n = n1 + n2
    u1 = average_ranks(both)[:n1].sum() - n1 * (n1 + 1) / 2
    _, counts = np.unique(both, return_counts=True)
    ties = float((counts ** 3 - counts).sum())
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0  # every value equal: nothing to tell apart
    z = max(0.0, abs(u1 - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return float(math.erfc(z / math.sqrt(2)))


def compare_intervals(before: Sequence[float], after: Sequence[float], alpha: float = ALPHA) -> Test:
    """Mann-Whitney over per-interval values; NaN intervals (no requests finished) are left out."""
    x = [v for v in before if v is not None and math.isfinite(v)]
    y = [v for v in after if v is not None and math.isfinite(v)]
    if len(x) < MIN_INTERVALS or len(y) < MIN_INTERVALS:
        return Test(None, False, len(x), len(y))
    p = mann_whitney_p(x, y)
    return Test(p, p < alpha, len(x), len(y))
