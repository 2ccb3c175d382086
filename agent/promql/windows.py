"""Range-function windows over samples fetched once per query, located with binary search.

A range query with a 5 s step over [5m] windows would otherwise re-read every sample 60 times
(one SQL join row per (step, sample)). Here the selected series' samples are read once, sorted by
(series, time); each (step, series) window is then an index interval [a, b] found by two binary
searches, and every function is computed from that interval:

* counts, first/last/previous sample, resets and changes: exact, from the interval ends and
  prefix counts of reset/change pairs (integers, so the differences are exact);
* counter-reset corrections: added one by one in time order to last - first, as Prometheus does;
* min/max: a sparse table (range-minimum query), level by level;
* sum/avg/stddev/stdvar_over_time, deriv, predict_linear: replayed with Prometheus 2.42's own
  Kahan-compensated, time-ordered arithmetic, position by position, vectorised across windows.
  No prefix-sum differences are used for floating-point sums: they would lose bits (large
  counters, fractional gauges) and the answers must equal promtool's bit for bit.

Example: samples of one series at 0..9 s, steps at 5 s and 9 s, range 5 s -> windows [0, 5], [4, 9].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vllm_sentinel.agent.promql import functions as fn


@dataclass
class Samples:
    """Non-stale samples of the selected series, sorted by (rank, ts); series `rank` is row rows[rank] of the query."""

    rank: np.ndarray  # int64, ascending
    ts: np.ndarray  # int64
    val: np.ndarray  # float64
    rows: np.ndarray  # int64: query row of each rank


@dataclass
class Windows:
    """The non-empty (step, series) windows: sample index interval [a, b] into Samples."""

    rows: np.ndarray  # query row (position in the selector's series list) of each window
    steps: np.ndarray  # step of each window
    a: np.ndarray  # first sample index
    b: np.ndarray  # last sample index (inclusive)

    @property
    def n(self) -> np.ndarray:
        """Samples per window."""
        return self.b - self.a + 1


def locate(s: Samples, refs: np.ndarray, range_ms: int) -> Windows:
    """Windows [ref - range, ref] (both ends closed) of every series row and step, empty ones dropped.

    Example: one series with samples at 0, 1000, 2000 ms, ref 2000, range 1000 -> a=1, b=2.
    """
    return locate_between(s, refs - range_ms, refs)


def locate_between(s: Samples, starts: np.ndarray, ends: np.ndarray) -> Windows:
    """Windows [starts[k], ends[k]] (both closed) of every series row, for each k (its "step"), empty ones dropped."""
    if not len(s.ts) or not len(starts):
        empty = np.zeros(0, dtype=np.int64)
        return Windows(empty, empty, empty, empty)
    lo = min(int(s.ts[0]), int(starts.min()))
    span = max(int(s.ts.max()), int(ends.max())) - lo + 2
    # one sorted key over all series: rank * span + (ts - lo); a window is a key interval
    key = s.rank * span + (s.ts - lo)
    row_base = (np.arange(len(s.rows), dtype=np.int64) * span)[:, None]
    lower = row_base + (starts - lo)[None, :]
    upper = row_base + np.maximum(ends - lo, starts - lo - 1)[None, :]  # an empty interval stays empty
    a = np.searchsorted(key, lower.ravel(), side="left")
    end = np.searchsorted(key, upper.ravel(), side="right")
    live = np.nonzero(end > a)[0]
    n_steps = len(starts)
    return Windows(s.rows[live // n_steps], live % n_steps, a[live], end[live] - 1)


def _pair_prefix(s: Samples, pair: np.ndarray) -> np.ndarray:
    """Prefix count P[j] of flagged pairs (j-1, j) of one series up to sample j; pair[j] flags (j-1, j)."""
    flags = np.zeros(len(s.ts), dtype=np.int64)
    flags[1:] = pair & (s.rank[1:] == s.rank[:-1])
    return np.cumsum(flags)


def _reset_pairs(s: Samples) -> np.ndarray:
    return s.val[1:] < s.val[:-1]  # NaN compares false, as in Go


def _change_pairs(s: Samples) -> np.ndarray:
    cur, prev = s.val[1:], s.val[:-1]
    return (cur != prev) & ~(np.isnan(cur) & np.isnan(prev))


def _live_order(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Windows ordered by length, longest first, and for each position how many windows reach it."""
    order = np.argsort(-n, kind="stable")
    ns = n[order]
    live = np.searchsorted(-ns, -np.arange(int(ns[0]) if len(ns) else 0), side="left")
    return order, live


def _kahan_sums(s: Samples, w: Windows, k: int, terms, ref: np.ndarray | None = None
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Kahan-Neumaier sums (sum, c) per window of the k terms(values, ts, ref of the live windows), in time order.

    Same operations as functions.kahan_inc (Prometheus' kahanSumInc), done in place on the live windows.
    """
    n = w.n
    if len(n) <= SCALAR_WINDOWS:
        return _kahan_sums_scalar(s, w, k, terms, ref)
    order, live = _live_order(n)
    a = w.a[order]
    ref_sorted = ref[order] if ref is not None else None
    m = len(n)
    sums = [(np.zeros(m), np.zeros(m)) for _ in range(k)]
    t, big, corr, alt = np.empty(m), np.empty(m, dtype=bool), np.empty(m), np.empty(m)
    with np.errstate(invalid="ignore", over="ignore"):
        for pos, count in enumerate(live.tolist()):
            idx = a[:count] + pos
            incs = terms(s.val[idx], s.ts[idx], ref_sorted[:count] if ref_sorted is not None else None)
            tk, bk, ck, ak = t[:count], big[:count], corr[:count], alt[:count]
            for (total, c), inc in zip(sums, incs):
                tot = total[:count]
                np.add(tot, inc, out=tk)
                np.greater_equal(np.abs(tot), np.abs(inc), out=bk)
                np.subtract(tot, tk, out=ck)  # big: (sum - t) + inc
                ck += inc
                np.subtract(inc, tk, out=ak)  # else: (inc - t) + sum
                ak += tot
                np.copyto(ck, ak, where=~bk)
                c[:count] += ck
                tot[...] = tk
    # back to window order
    out = []
    for total, c in sums:
        t2, c2 = np.empty_like(total), np.empty_like(c)
        t2[order], c2[order] = total, c
        out.append((t2, c2))
    return out


# at most this many windows are folded one by one in Python floats: an instant query's few long windows
# (the daemon's rules) would otherwise pay numpy's per-call cost once per sample position
SCALAR_WINDOWS = 8


def _kahan_sums_scalar(s: Samples, w: Windows, k: int, terms, ref: np.ndarray | None
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
    """_kahan_sums for a few windows: the terms computed per window at once (elementwise, so the same
    values), folded in Python floats in time order. predict_linear over 10 minutes at 1 s paid 32 numpy
    calls per sample position for the one window of an instant query: 20 ms of the GPU host's evaluation."""
    m = len(w.n)
    sums = [(np.zeros(m), np.zeros(m)) for _ in range(k)]
    for i, (a, count) in enumerate(zip(w.a.tolist(), w.n.tolist())):
        window_ref = np.full(count, ref[i]) if ref is not None else None
        with np.errstate(invalid="ignore", over="ignore"):
            incs = terms(s.val[a:a + count], s.ts[a:a + count], window_ref)
        for (total_out, c_out), inc_values in zip(sums, incs):
            total = c = 0.0
            for inc in inc_values.tolist():
                t = total + inc
                c += (total - t) + inc if abs(total) >= abs(inc) else (inc - t) + total
                total = t
            total_out[i], c_out[i] = total, c
    return sums


def _kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """fn.kahan_inc for one float."""
    t = total + inc
    return t, c + ((total - t) + inc if abs(total) >= abs(inc) else (inc - t) + total)


def _fold_one(name: str, values: list[float]) -> float:
    """_sequential's fold of one window, in Python floats (the same operations in the same order)."""
    mean = c = aux = c_aux = 0.0
    count = 0.0
    for v in values:
        count += 1.0
        if name == "avg_over_time":
            if math.isinf(mean) and ((math.isinf(v) and (mean > 0) == (v > 0)) or (not math.isinf(v)
                                                                                   and v == v)):
                continue
            mean, c = _kahan_inc(v / count - mean / count, mean, c)
        else:
            delta = v - (mean + c)
            mean, c = _kahan_inc(delta / count, mean, c)
            aux, c_aux = _kahan_inc(delta * (v - (mean + c)), aux, c_aux)
    if name == "avg_over_time":
        return mean if math.isinf(mean) else mean + c
    var = (aux + c_aux) / count
    if name == "stddev_over_time":
        with np.errstate(invalid="ignore"):
            return float(np.sqrt(var))  # numpy's, for the same NaN below zero as the vectorised fold
    return var


def _constant_windows(s: Samples, w: Windows) -> np.ndarray:
    """Per window: every value the same finite float, bit for bit (-0.0 and 0.0 differ)."""
    bits = np.asarray(s.val, dtype=np.float64).view(np.int64)
    prefix = _pair_prefix(s, bits[1:] != bits[:-1])
    return ((prefix[w.b] - prefix[w.a]) == 0) & np.isfinite(s.val[w.a])


def _sequential(name: str, s: Samples, w: Windows) -> np.ndarray:
    """avg/stddev/stdvar_over_time as Prometheus 2.42 folds them: Kahan-compensated, in time order.

    A window of one repeated finite value v folds to exactly 0.0 + v (avg: the first step adds v to 0.0,
    every later one adds v/k - v/k = 0.0) or 0.0 (the variances: every delta after the first is 0.0), so
    those windows skip the fold: a gauge at rest (nothing waiting for 10 minutes) costs no loop.
    """
    constant = _constant_windows(s, w)
    if constant.any():
        out = np.empty(len(w.n))
        out[constant] = 0.0 + s.val[w.a[constant]] if name == "avg_over_time" else 0.0
        rest = ~constant
        if rest.any():
            out[rest] = _fold(name, s, Windows(w.rows[rest], w.steps[rest], w.a[rest], w.b[rest]))
        return out
    return _fold(name, s, w)


def _fold(name: str, s: Samples, w: Windows) -> np.ndarray:
    """_sequential's fold of every window, the few in Python floats, the many vectorised by position."""
    n = w.n
    if len(n) <= SCALAR_WINDOWS:
        return np.array([_fold_one(name, s.val[a:a + k].tolist()) for a, k in zip(w.a.tolist(), n.tolist())],
                        dtype=np.float64)
    order, live = _live_order(n)
    a = w.a[order]
    m = len(n)
    mean, c = np.zeros(m), np.zeros(m)
    aux, c_aux = np.zeros(m), np.zeros(m)
    with np.errstate(all="ignore"):
        for pos, k in enumerate(live.tolist()):
            v = s.val[a[:k] + pos]
            count = float(pos + 1)  # every live window has seen exactly pos + 1 samples
            mk, ck = mean[:k], c[:k]
            if name == "avg_over_time":
                inf = np.isinf(mk)
                skip = inf & ((np.isinf(v) & ((mk > 0) == (v > 0))) | (~np.isinf(v) & ~np.isnan(v)))
                m2, c2 = fn.kahan_inc(v / count - mk / count, mk, ck)
                mean[:k], c[:k] = np.where(skip, mk, m2), np.where(skip, ck, c2)
            else:
                delta = v - (mk + ck)
                m2, c2 = fn.kahan_inc(delta / count, mk, ck)
                a2, ca2 = fn.kahan_inc(delta * (v - (m2 + c2)), aux[:k], c_aux[:k])
                mean[:k], c[:k], aux[:k], c_aux[:k] = m2, c2, a2, ca2
        if name == "avg_over_time":
            res = np.where(np.isinf(mean), mean, mean + c)
        else:
            res = (aux + c_aux) / n[order].astype(np.float64)
            if name == "stddev_over_time":
                res = np.sqrt(res)
    out = np.empty(m)
    out[order] = res
    return out


def _min_max(s: Samples, w: Windows, is_max: bool) -> np.ndarray:
    """Range min/max ignoring NaN (NaN only when all are NaN), via a sparse table built level by level."""
    pick = np.fmax if is_max else np.fmin
    n = w.n
    level_of = np.frexp(n.astype(np.float64))[1].astype(np.int64) - 1  # floor(log2 n), exactly
    out = np.empty(len(n))
    table = s.val
    for level in range(int(level_of.max()) + 1 if len(n) else 0):
        sel = np.nonzero(level_of == level)[0]
        if len(sel):
            width = 1 << level
            out[sel] = pick(table[w.a[sel]], table[w.b[sel] - width + 1])
        half = 1 << level
        table = pick(table[:-half], table[half:]) if len(table) > half else table[:0]
    return out


def range_function(name: str, s: Samples, w: Windows, t_eval: np.ndarray, range_start: np.ndarray,
                   range_end: np.ndarray, range_s: float,
                   param: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Values of range function `name` for every window; returns (values, ok), ok False where no result.

    t_eval, range_start, range_end: per window. Example: rate over samples (0s, 0), (60s, 60) in a
    [1m] window ending at 60 s -> 1.0.
    """
    n = w.n
    ones = np.ones(len(n), dtype=bool)
    if not len(n):
        return np.zeros(0), ones
    a, b = w.a, w.b
    if name in ("rate", "increase", "delta"):
        resets = None
        if name != "delta":
            prefix = _pair_prefix(s, _reset_pairs(s))
            n_resets = prefix[b] - prefix[a]
            if n_resets.any():
                positions = np.nonzero(np.diff(prefix))[0] + 1  # sample index of each reset, in order
                corrections = s.val[positions - 1]
                resets = (n_resets, prefix[a], corrections)
        return fn.extrapolated_rate(n, s.ts[a], s.val[a], s.ts[b], s.val[b], resets, range_start, range_end,
                                    range_s, is_counter=name != "delta", is_rate=name == "rate")
    if name in ("irate", "idelta"):
        p = np.maximum(b - 1, 0)
        return fn.instant_value(n, s.val[b], s.ts[b], s.val[p], s.ts[p], is_rate=name == "irate")
    if name in ("resets", "changes"):
        prefix = _pair_prefix(s, _reset_pairs(s) if name == "resets" else _change_pairs(s))
        return (prefix[b] - prefix[a]).astype(np.float64), ones
    if name in ("deriv", "predict_linear"):
        t_ref = s.ts[a] if name == "deriv" else t_eval
        sums = _kahan_sums(s, w, 4, _regression_terms, ref=t_ref)
        sx, sy, sxy, sx2 = (total + c for total, c in sums)
        nf = n.astype(np.float64)
        with np.errstate(all="ignore"):
            slope = (sxy - sx * sy / nf) / (sx2 - sx * sx / nf)
            intercept = sy / nf - slope * sx / nf
        prefix = _pair_prefix(s, s.val[1:] != s.val[:-1])  # Go's != (NaN differs from everything)
        const = (prefix[b] - prefix[a]) == 0
        y0 = s.val[a]
        slope = np.where(const, np.where(np.isinf(y0), math.nan, 0.0), slope)
        intercept = np.where(const, np.where(np.isinf(y0), math.nan, y0), intercept)
        if name == "deriv":
            return slope, n >= 2
        return slope * param + intercept, n >= 2
    if name in ("avg_over_time", "stddev_over_time", "stdvar_over_time"):
        return _sequential(name, s, w), ones
    if name == "sum_over_time":
        ((total, c),) = _kahan_sums(s, w, 1, lambda v, ts, ref: (v,))
        with np.errstate(invalid="ignore"):
            return np.where(np.isinf(total), total, total + c), ones
    if name in ("min_over_time", "max_over_time"):
        return _min_max(s, w, is_max=name == "max_over_time"), ones
    if name == "count_over_time":
        return n.astype(np.float64), ones
    if name == "last_over_time":
        return s.val[b].copy(), ones
    if name in ("present_over_time", "absent_over_time"):
        return np.ones(len(n)), ones
    raise ValueError(f"range_function: {name} is not computed from windows")


def _regression_terms(v: np.ndarray, ts: np.ndarray, t_ref: np.ndarray) -> tuple[np.ndarray, ...]:
    x = (ts - t_ref).astype(np.float64) / 1e3
    return x, v, x * v, x * x
