"""min and max without a loop over series give what Prometheus' fold in series order gives, bit for bit."""

from __future__ import annotations

import math

import numpy as np

from vllm_sentinel.agent.promql.algebra import _extreme, _sequential

VALUES = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 2.5]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def test_min_max_equal_the_ordered_fold_with_nan_infinities_and_signed_zeros():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        rows, steps = int(rng.integers(1, 6)), 3
        V = rng.choice(VALUES, (rows, steps))
        P = rng.random((rows, steps)) < 0.7
        present = P.any(axis=0)
        for op in ("max", "min"):
            got, want = _extreme(op, V, P, steps), _sequential(op, V, P, steps)
            assert all(_same(a, b) for a, b in zip(got[present], want[present])), (op, V, P)


def test_a_nan_first_is_replaced_and_a_zero_keeps_the_sign_seen_first():
    P = np.ones((3, 1), dtype=bool)
    assert _extreme("max", np.array([[math.nan], [1.0], [math.nan]]), P, 1)[0] == 1.0
    assert math.isnan(_extreme("min", np.array([[math.nan], [math.nan], [math.nan]]), P, 1)[0])
    assert math.copysign(1, _extreme("max", np.array([[-0.0], [0.0], [-1.0]]), P, 1)[0]) == -1
