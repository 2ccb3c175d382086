"""Numeric kernels of PromQL functions, vectorised with numpy, written to round exactly as Prometheus 2.42.

The operation order of each formula follows Prometheus (promql/functions.go, quantile.go) so that
results compare equal bit for bit with promtool, not only within a tolerance.
"""

from __future__ import annotations

import math

import numpy as np


def extrapolated_rate(n: np.ndarray, t0: np.ndarray, v0: np.ndarray, t1: np.ndarray, v1: np.ndarray,
                      resets: tuple[np.ndarray, np.ndarray, np.ndarray] | None, range_start: np.ndarray, range_end: np.ndarray,
                      range_s: float, is_counter: bool, is_rate: bool) -> tuple[np.ndarray, np.ndarray]:
    """rate/increase/delta per window; returns (values, ok) where ok is False for windows of < 2 samples.

    resets: (count, first, corrections): window i adds corrections[first[i]:first[i] + count[i]].

    Example: samples (0s, 0) and (60s, 60) in a [1m] window ending at 60s -> rate 1.0.
    """
    ok = n >= 2
    result = v1 - v0
    if is_counter and resets is not None:
        # corrections are added one by one in time order, as Prometheus does
        count, first, corrections = resets
        for k in range(int(count.max()) if len(count) else 0):
            m = count > k
            result[m] = result[m] + corrections[first[m] + k]
    with np.errstate(divide="ignore", invalid="ignore"):
        duration_to_start = (t0 - range_start).astype(np.float64) / 1000
        duration_to_end = (range_end - t1).astype(np.float64) / 1000
        sampled = (t1 - t0).astype(np.float64) / 1000
        avg_between = sampled / (n - 1).astype(np.float64)
        if is_counter:
            zero_ok = (result > 0) & (v0 >= 0)
            duration_to_zero = sampled * (v0 / result)
            use_zero = zero_ok & (duration_to_zero < duration_to_start)
            duration_to_start = np.where(use_zero, duration_to_zero, duration_to_start)
        threshold = avg_between * 1.1
        interval = sampled + np.where(duration_to_start < threshold, duration_to_start, avg_between / 2)
        interval = interval + np.where(duration_to_end < threshold, duration_to_end, avg_between / 2)
        factor = interval / sampled
        if is_rate:
            factor = factor / range_s
        return result * factor, ok


def instant_value(n: np.ndarray, v1: np.ndarray, t1: np.ndarray, vp: np.ndarray, tp: np.ndarray,
                  is_rate: bool) -> tuple[np.ndarray, np.ndarray]:
    """irate/idelta from the last two samples of each window; returns (values, ok)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if is_rate:
            result = np.where(v1 < vp, v1, v1 - vp)
        else:
            result = v1 - vp
        interval = t1 - tp
        ok = (n >= 2) & (interval != 0)
        if is_rate:
            result = result / (interval.astype(np.float64) / 1000)
    return result, ok


def kahan_inc(inc: np.ndarray, total: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One Kahan-Neumaier step, elementwise (Prometheus' kahanSumInc)."""
    t = total + inc
    big = np.abs(total) >= np.abs(inc)
    with np.errstate(invalid="ignore"):
        c = c + np.where(big, (total - t) + inc, (inc - t) + total)
    return t, c


def go_quantile(q: float, values: np.ndarray) -> float:
    """Prometheus' quantile(): linear interpolation between closest ranks, NaN sorted first."""
    n = len(values)
    if n == 0 or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    nan = np.isnan(values)
    ordered = np.concatenate([values[nan], np.sort(values[~nan])])
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1.0, lower + 1)
    weight = rank - math.floor(rank)
    return float(ordered[int(lower)] * (1 - weight) + ordered[int(upper)] * weight)


def bucket_quantile(q: float, bounds: np.ndarray, counts: np.ndarray) -> float:
    """histogram_quantile over classic buckets, with Prometheus 2.42's edge cases.

    Example: bounds [1, 2, inf], counts [1, 2, 2], q 0.5 -> 1.0.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    order = np.argsort(bounds, kind="stable")
    bounds, counts = bounds[order], counts[order]
    if not (math.isinf(bounds[-1]) and bounds[-1] > 0):
        return math.nan
    # coalesce buckets with the same upper bound (le="1" and le="1.0")
    ub: list[float] = []
    cnt: list[float] = []
    for b, c in zip(bounds.tolist(), counts.tolist()):
        if ub and b == ub[-1]:
            cnt[-1] += c
        else:
            ub.append(b)
            cnt.append(c)
    # ensure monotonic counts, comparing as Go does (NaN compares false both ways)
    top = cnt[0]
    for i in range(1, len(cnt)):
        if cnt[i] > top:
            top = cnt[i]
        elif cnt[i] < top:
            cnt[i] = top
    if len(ub) < 2:
        return math.nan
    observations = cnt[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = len(ub) - 1
    for i in range(len(ub) - 1):  # sort.Search: first bucket whose count >= rank
        if cnt[i] >= rank:
            b = i
            break
    if b == len(ub) - 1:
        return ub[-2]
    if b == 0 and ub[0] <= 0:
        return ub[0]
    start = 0.0
    end = ub[b]
    count = cnt[b]
    if b > 0:
        start = ub[b - 1]
        count -= cnt[b - 1]
        rank -= cnt[b - 1]
    return start + (end - start) * _div(rank, count)


def _div(a: float, b: float) -> float:
    """IEEE division as Go does it (x/0 is +-Inf or NaN, never an exception)."""
    with np.errstate(all="ignore"):
        return float(np.float64(a) / np.float64(b))


def go_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Go's math.Mod (sign of the dividend), elementwise."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b)


def go_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Go's math.Pow, elementwise (IEEE pow; 1**NaN is 1 and x**0 is 1 in both)."""
    with np.errstate(all="ignore"):
        return np.power(a, b)


def sgn(v: np.ndarray) -> np.ndarray:
    """sgn(): -1, 1, or the value itself for zero and NaN."""
    return np.where(v < 0, -1.0, np.where(v > 0, 1.0, v))


def go_round(v: np.ndarray, to_nearest: np.ndarray) -> np.ndarray:
    """round(v, to_nearest): ties round up, computed via the inverse as Prometheus does."""
    with np.errstate(all="ignore"):
        inv = 1.0 / to_nearest
        return np.floor(v * inv + 0.5) / inv


SIMPLE_MATH = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "exp": np.exp, "sqrt": np.sqrt,
    "ln": np.log, "log2": np.log2, "log10": np.log10, "sgn": sgn,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "deg": lambda v: v * 180 / math.pi, "rad": lambda v: v * math.pi / 180,
}


def bucket_quantile_steps(q: np.ndarray, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """bucket_quantile for many steps at once: counts is (buckets x steps), q one value per step.

    Same operations in the same order as bucket_quantile (and Prometheus), vectorised over steps.
    """
    steps = counts.shape[1]
    out = np.full(steps, np.nan)
    order = np.argsort(bounds, kind="stable")
    bounds, counts = bounds[order], counts[order]
    if math.isinf(bounds[-1]) and bounds[-1] > 0:
        # coalesce equal bounds, then ensure monotonic counts the way Go compares (NaN never moves)
        ub, starts = np.unique(bounds, return_index=True)
        c = np.add.reduceat(counts, starts, axis=0) if len(ub) < len(bounds) else counts.copy()
        top = c[0].copy()
        for i in range(1, len(ub)):
            gt, lt = c[i] > top, c[i] < top
            top = np.where(gt, c[i], top)
            c[i] = np.where(lt, top, c[i])
        if len(ub) >= 2:
            with np.errstate(all="ignore"):
                obs = c[-1]
                rank = q * obs
                ge = c[:-1] >= rank
                b = np.where(ge.any(axis=0), ge.argmax(axis=0), len(ub) - 1)
                cols = np.arange(steps)
                prev = np.clip(b - 1, 0, None)
                has_prev = b > 0
                start = np.where(has_prev, ub[prev], 0.0)
                bi = np.clip(b, 0, len(ub) - 1)
                end = ub[bi]
                count = np.where(has_prev, c[bi, cols] - c[prev, cols], c[bi, cols])
                rank2 = np.where(has_prev, rank - c[prev, cols], rank)
                res = start + (end - start) * (rank2 / count)
                res = np.where((b == 0) & (ub[0] <= 0), ub[0], res)
                res = np.where(b == len(ub) - 1, ub[-2], res)
                res = np.where(obs == 0, np.nan, res)
                out = res
    with np.errstate(invalid="ignore"):
        out = np.where(q > 1, np.inf, out)
        out = np.where(q < 0, -np.inf, out)
    return np.where(np.isnan(q), np.nan, out)
