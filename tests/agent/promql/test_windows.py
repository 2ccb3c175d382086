"""Window location and per-window kernels of windows.py, against hand-computed Prometheus answers."""

from __future__ import annotations

import math

import numpy as np

from vllm_sentinel.agent.promql import windows


def _samples(series: list[list[tuple[int, float]]]) -> windows.Samples:
    rank = np.array([r for r, pts in enumerate(series) for _ in pts], dtype=np.int64)
    ts = np.array([t for pts in series for t, _ in pts], dtype=np.int64)
    val = np.array([v for pts in series for _, v in pts], dtype=np.float64)
    return windows.Samples(rank, ts, val, np.arange(len(series), dtype=np.int64))


def _run(name: str, s: windows.Samples, refs: list[int], range_ms: int, param=None):
    refs_a = np.array(refs, dtype=np.int64)
    w = windows.locate(s, refs_a, range_ms)
    t = refs_a[w.steps]
    values, ok = windows.range_function(name, s, w, t, t - range_ms, t, range_ms / 1000, param)
    return {(int(r), int(st)): float(v) for r, st, v, g in zip(w.rows, w.steps, values, ok) if g}


def test_windows_are_closed_at_both_ends_and_empty_ones_are_dropped():
    s = _samples([[(t * 1000, float(t)) for t in range(10)], [(50_000, 1.0)]])
    w = windows.locate(s, np.array([5_000, 9_000], dtype=np.int64), 5_000)
    assert list(zip(w.rows.tolist(), w.steps.tolist(), w.a.tolist(), w.b.tolist())) == [(0, 0, 0, 5), (0, 1, 4, 9)]


def test_reset_corrections_are_added_in_time_order_only_inside_the_window():
    # 10 20 5 (reset, +20) 8 2 (reset, +8) ; the reset at the window's first sample does not count
    s = _samples([[(0, 10.0), (10_000, 20.0), (20_000, 5.0), (30_000, 8.0), (40_000, 2.0)]])
    assert _run("resets", s, [40_000, 40_000 + 20_000], 40_000) == {(0, 0): 2.0, (0, 1): 1.0}
    inc = _run("increase", s, [40_000], 40_000)[(0, 0)]
    assert inc == (2.0 - 10.0 + 20.0 + 8.0) * 1.0  # whole range sampled: no extrapolation beyond it


def test_min_max_ignore_nan_unless_all_are_nan():
    s = _samples([[(0, math.nan), (1000, 3.0), (2000, math.nan), (3000, -1.0)], [(0, math.nan), (1000, math.nan)]])
    assert _run("max_over_time", s, [3000], 3000)[(0, 0)] == 3.0
    assert _run("min_over_time", s, [3000], 3000)[(0, 0)] == -1.0
    assert math.isnan(_run("max_over_time", s, [3000], 3000)[(1, 0)])


def test_deriv_of_a_constant_is_zero_and_of_a_line_its_slope():
    s = _samples([[(t * 1000, 7.0) for t in range(5)], [(t * 1000, 2.0 * t) for t in range(5)]])
    got = _run("deriv", s, [4000], 4000)
    assert got == {(0, 0): 0.0, (1, 0): 2.0}


def test_few_windows_fold_in_python_floats_exactly_as_many_fold_in_numpy(monkeypatch):
    # the live evaluator asks instant queries: a few long windows, folded one by one in Python floats;
    # range queries fold many windows at once in numpy. Both must give the same bits, inf and NaN included.
    rng = np.random.default_rng(7)
    special = [math.inf, -math.inf, math.nan, 1e308, -1e308, 0.0, -0.0]
    series = []
    for r in range(6):
        vals = rng.normal(0, 10.0 ** rng.integers(-3, 12), size=40 + r * 37)
        if r >= 3:
            vals[rng.integers(0, len(vals), size=5)] = rng.choice(special, size=5)
        series.append([(t * 1000, float(v)) for t, v in enumerate(vals)])
    s = _samples(series)
    refs = [39_000, 100_000, 230_000]
    for name in ("avg_over_time", "stddev_over_time", "stdvar_over_time", "sum_over_time", "deriv",
                 "predict_linear"):
        param = 300.0 if name == "predict_linear" else None
        monkeypatch.setattr(windows, "SCALAR_WINDOWS", 0)
        many = _run(name, s, refs, 60_000, param)
        monkeypatch.setattr(windows, "SCALAR_WINDOWS", 10**9)
        few = _run(name, s, refs, 60_000, param)
        assert many.keys() == few.keys() and len(many) > 10
        for k in many:
            assert np.float64(many[k]).tobytes() == np.float64(few[k]).tobytes(), (name, k, many[k], few[k])


def test_windows_of_one_repeated_value_give_the_folds_bits_without_folding(monkeypatch):
    # a gauge at rest (0 requests waiting for 10 minutes) skips the Kahan fold: the answer must be the fold's
    values = [0.0, -0.0, 3.0, -2.5, 1e308, -1e-300, 7.25, math.inf, -math.inf, math.nan]
    series = [[(t * 1000, v) for t in range(30)] for v in values]
    series.append([(t * 1000, 1.0 if t != 12 else 2.0) for t in range(30)])  # one change: folded
    series.append([(t * 1000, 0.0 if t % 2 else -0.0) for t in range(30)])  # equal as floats, not as bits
    s = _samples(series)
    refs = [5_000, 29_000, 40_000]
    for name in ("avg_over_time", "stddev_over_time", "stdvar_over_time"):
        monkeypatch.setattr(windows, "_constant_windows", lambda s, w: np.zeros(len(w.n), dtype=bool))
        folded = _run(name, s, refs, 20_000)
        monkeypatch.undo()
        fast = _run(name, s, refs, 20_000)
        assert fast.keys() == folded.keys() and len(fast) == 3 * len(series)
        for k in fast:
            assert np.float64(fast[k]).tobytes() == np.float64(folded[k]).tobytes(), (name, k, fast[k], folded[k])
    assert np.float64(_run("avg_over_time", s, [29_000], 20_000)[(1, 0)]).tobytes() == np.float64(0.0).tobytes()
