"""Aggregations over instant vectors (sum, count, group, avg, min, max, stddev, stdvar, quantile, topk, bottomk).

Each group's series are folded in input order as Prometheus 2.42 folds them, so float answers agree to the last bit.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from vllm_sentinel.agent.promql import functions as fn
from vllm_sentinel.agent.promql.keymemo import MEMO
from vllm_sentinel.agent.promql.parser import PromQLError, Unsupported
from vllm_sentinel.agent.promql.vectors import Labels, Vec


def order_sensitive(op: str, vec: Vec, grouping: list[str], without: bool, param, n: int) -> bool:
    """True when some input order of the series would change this aggregation's answer (tests only)."""
    groups: dict[Labels, list[int]] = {}
    for i, k in enumerate(vec.keys):
        groups.setdefault(_group_key(k, tuple(grouping), without), []).append(i)
    for rows in groups.values():
        if op in ("topk", "bottomk"):
            for t in range(n):
                vals = vec.v[rows, t][vec.ok[rows, t]]
                if len(vals) != len(np.unique(vals)):
                    return True  # a tie: which series is kept depends on order
            continue
        if op not in ("sum", "avg", "stddev", "stdvar") or len(rows) < 2:
            continue
        if len(rows) > 6:
            return True
        sub = Vec([vec.keys[i] for i in rows], vec.v[rows], vec.ok[rows])
        want = aggregate(op, sub, param, [], False, n)
        for perm in itertools.permutations(range(len(rows))):
            other = aggregate(op, Vec([sub.keys[i] for i in perm], sub.v[list(perm)], sub.ok[list(perm)]),
                               param, [], False, n)
            if not np.array_equal(want.v[want.ok], other.v[other.ok], equal_nan=True):
                return True
    return False


@functools.lru_cache(maxsize=1 << 16)
def _group_key(key: Labels, grouping: tuple[str, ...], without: bool) -> Labels:
    # kept: the same series are grouped the same way at every evaluation of the daemon's rules
    if without:
        drop = set(grouping) | {"__name__"}
        return tuple(kv for kv in key if kv[0] not in drop)
    keep = set(grouping)
    return tuple(kv for kv in key if kv[0] in keep)


def aggregate(op: str, vec: Vec, param, grouping: list[str], without: bool, n: int) -> Vec:
    """`op by|without (grouping) (vec)`: sum, count, group, avg, min, max, stddev, stdvar, quantile, topk, bottomk."""
    groups, gidx, group_keys = _grouped(vec.keys, tuple(grouping), without)
    if op in ("topk", "bottomk"):
        return _topk(op, vec, groups, param, n)
    if op in ("sum", "count", "group"):
        return _sum_count(op, vec, groups, gidx, group_keys, n)
    keys, vs, oks = [], [], []
    with np.errstate(all="ignore"):  # once, not per group: entering it costs more than a small group's sum
        for gkey, rows in groups.items():
            V, P = vec.v[rows], vec.ok[rows]
            present = P.any(axis=0)
            if not present.any():
                continue
            if op in ("min", "max"):
                out = _extreme(op, V, P, n)
            elif op in ("avg", "stddev", "stdvar"):
                out = _sequential(op, V, P, n)
            elif op == "quantile":
                out = np.full(n, math.nan)
                for t in np.nonzero(present)[0]:
                    out[t] = fn.go_quantile(float(param[t]), V[P[:, t], t])
            else:
                raise Unsupported(f"unsupported: aggregation {op}")
            keys.append(gkey)
            vs.append(out)
            oks.append(present)
    if not keys:
        return Vec.empty(n)
    return Vec(group_keys if len(keys) == len(group_keys) else keys, np.array(vs), np.array(oks, dtype=bool))


def _grouped(keys, grouping: tuple[str, ...], without: bool
             ) -> tuple[dict[Labels, list[int]], np.ndarray, tuple[Labels, ...]]:
    """The rows of each group (in first-seen order), each row's group number, and the groups' keys."""
    def build():
        groups: dict[Labels, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(_group_key(k, grouping, without), []).append(i)
        gidx = np.empty(len(keys), dtype=np.int64)
        for g, rows in enumerate(groups.values()):
            gidx[rows] = g
        gidx.flags.writeable = False  # remembered: shared by later evaluations
        return groups, gidx, tuple(groups)
    return MEMO.get(keys, ("group", grouping, without), build)


def _sum_count(op: str, vec: Vec, groups: dict[Labels, list[int]], gidx: np.ndarray,
               group_keys: tuple[Labels, ...], n: int) -> Vec:
    """sum, count and group of every group at once: each group's series added one by one in input order.

    np.add.at adds row after row, as Prometheus does; a plain `.sum(axis=0)` of one step's column
    would sum pairwise and differ from it in the last bits once a group has 8 series or more.
    """
    if not groups:
        return Vec.empty(n)
    counts = np.zeros((len(groups), n), dtype=np.int64)
    np.add.at(counts, gidx, vec.ok)
    if op == "sum":
        with np.errstate(all="ignore"):
            out = np.zeros((len(groups), n))
            np.add.at(out, gidx, np.where(vec.ok, vec.v, 0.0))
    elif op == "count":
        out = counts.astype(np.float64)
    else:
        out = np.ones((len(groups), n))
    present = counts > 0
    live = present.any(axis=1)
    keys = group_keys
    if not live.all():
        keys = [k for k, keep in zip(keys, live) if keep]
        out, present = out[live], present[live]
    if not keys:
        return Vec.empty(n)
    return Vec(keys, out, present)


def _extreme(op: str, V: np.ndarray, P: np.ndarray, n: int) -> np.ndarray:
    """min/max of a group per step: _sequential's answer without its loop over series.

    Folded in order, a NaN is replaced by the next value and never replaces a number, so the answer is
    the extreme of the numbers, NaN when there are none. Only the sign of a zero extreme depends on
    order (the first of 0.0 and -0.0 stays): where both are present, the fold itself decides.
    """
    number = P & ~np.isnan(V)
    filled = np.where(number, V, -math.inf if op == "max" else math.inf)
    out = filled.max(axis=0) if op == "max" else filled.min(axis=0)
    zeros = number & (V == 0)
    negative = np.signbit(V)
    if ((zeros & negative).any(axis=0) & (zeros & ~negative).any(axis=0)).any():
        return _sequential(op, V, P, n)
    return np.where(number.any(axis=0), out, math.nan)


def _sequential(op: str, V: np.ndarray, P: np.ndarray, n: int) -> np.ndarray:
    """avg/min/max/stddev/stdvar folded series by series in input order, exactly as Prometheus does."""
    count = np.zeros(n)
    value = np.full(n, math.nan)
    mean = np.full(n, math.nan)
    for r in range(V.shape[0]):
        p, v = P[r], V[r]
        first = p & (count == 0)
        later = p & (count > 0)
        count = count + p
        if op == "avg":
            mean = np.where(first, v, mean)
            inf_mean = np.isinf(mean)
            skip = inf_mean & ((np.isinf(v) & ((mean > 0) == (v > 0))) | (~np.isinf(v) & ~np.isnan(v)))
            upd = later & ~skip
            mean = np.where(upd, mean + (v / count - mean / count), mean)
        elif op == "max":
            value = np.where(first | (later & ((value < v) | np.isnan(value))), v, value)
        elif op == "min":
            value = np.where(first | (later & ((value > v) | np.isnan(value))), v, value)
        else:
            mean = np.where(first, v, mean)
            value = np.where(first, 0.0, value)
            delta = v - mean
            new_mean = mean + delta / count
            value = np.where(later, value + delta * (v - new_mean), value)
            mean = np.where(later, new_mean, mean)
    if op == "avg":
        return mean
    if op == "stdvar":
        return value / count
    if op == "stddev":
        return np.sqrt(value / count)
    return value


def _topk(op: str, vec: Vec, groups: dict[Labels, list[int]], param: np.ndarray, n: int) -> Vec:
    ok = np.zeros_like(vec.ok)
    for t in range(n):
        f = float(param[t])
        if math.isnan(f) or abs(f) >= 2 ** 63:
            raise PromQLError(f"Scalar value {f} overflows int64")
        k = int(f)
        if k < 1:
            continue
        for rows in groups.values():
            live = [r for r in rows if vec.ok[r, t]]
            if not live:
                continue
            vals = vec.v[live, t]
            # NaN is dropped first by both topk and bottomk
            nan = np.isnan(vals)
            order = np.lexsort((-vals if op == "topk" else vals, nan))
            for r in np.asarray(live)[order[:k]]:
                ok[r, t] = True
    return Vec(vec.keys, vec.v.copy(), ok)
