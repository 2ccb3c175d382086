"""Mann-Whitney U as compare uses it: ranks with ties, a p-value, and too few intervals never significant."""

from __future__ import annotations

import math

import numpy as np

from vllm_sentinel.agent.diagnosis.significance import (ALPHA, MIN_INTERVALS, average_ranks, compare_intervals,
                                                        mann_whitney_p)


def test_ties_share_their_average_rank() -> None:
    assert average_ranks(np.array([10.0, 20.0, 20.0, 5.0])).tolist() == [2.0, 3.5, 3.5, 1.0]


def test_full_separation_matches_the_normal_approximation_by_hand() -> None:
    # U = 0 of 64 pairs: z = (32 - 0.5) / sqrt(8 * 8 * 17 / 12)
    z = 31.5 / math.sqrt(8 * 8 * 17 / 12)
    p = mann_whitney_p(range(1, 9), range(11, 19))
    assert math.isclose(p, math.erfc(z / math.sqrt(2)), rel_tol=1e-12)
    assert p == mann_whitney_p(range(11, 19), range(1, 9))  # two-sided: the order of the sides does not matter


def test_identical_and_overlapping_samples_are_not_significant() -> None:
    assert mann_whitney_p([0.0] * 10, [0.0] * 10) == 1.0  # an idle counter on both sides
    rng = np.random.default_rng(7)
    draws = rng.normal(1.0, 0.2, size=(200, 2, 12))
    p_values = [mann_whitney_p(a, b) for a, b in draws]
    # same distribution: about ALPHA of the pairs fall under ALPHA, far from all of them
    assert sum(p < ALPHA for p in p_values) <= 10


def test_too_few_intervals_or_gaps_are_not_tested() -> None:
    few = compare_intervals([1.0] * (MIN_INTERVALS - 1), [9.0] * 20)
    assert few.p_value is None and not few.significant
    gaps = compare_intervals([1.0, float("nan"), None, 1.1, 1.2, 0.9, 1.0, 1.05], [5.0, 5.1, 4.9, 5.2, 5.0, 5.3])
    assert gaps.n_before == 6 and gaps.significant
