"""PromQL evaluated over the DuckDB store, with Prometheus 2.42's numbers.

Every expression is evaluated for a grid of steps at once: an instant-vector value is a matrix of
(series x steps) values plus a presence mask, so a range query runs one SQL statement per selector
and numpy operations per node, never a Python loop over raw samples.

    engine = Engine(store)
    engine.instant('sum by (instance) (rate(vllm:prompt_tokens_total[1m]))', t_ms)
    engine.range('vllm:num_requests_waiting > 0', start_ms, end_ms, 5_000)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql import functions as fn
from vllm_sentinel.agent.promql import sql, windows
from vllm_sentinel.agent.promql.parser import (PromQLError, Unsupported, check_at, duration_ms, matchers_of,
                                               op_name, parse)

__all__ = ["Engine", "Sample", "Series", "PromQLError", "Unsupported"]

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: hashable label set


@dataclass
class Sample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


@dataclass
class Series:
    """One series of a range result: (t_ms, value) points in time order."""

    labels: dict[str, str]
    points: list[tuple[int, float]]


@dataclass
class _Vec:
    """An instant vector over all steps: row i has labels keys[i], values v[i], presence ok[i]."""

    keys: list[Labels]
    v: np.ndarray  # float64 (rows, steps)
    ok: np.ndarray  # bool (rows, steps)
    ts: np.ndarray | None = None  # int64 sample timestamps, for timestamp() of a selector

    @staticmethod
    def empty(n: int) -> "_Vec":
        return _Vec([], np.zeros((0, n)), np.zeros((0, n), dtype=bool))


@dataclass
class _Str:
    value: str


ARITH = {"+", "-", "*", "/", "%", "^", "atan2"}
COMPARISON = {"==", "!=", ">", "<", ">=", "<="}
SET_OPS = {"and", "or", "unless"}
RANGE_FUNCS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "resets", "changes",
               "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
               "last_over_time", "quantile_over_time", "stddev_over_time", "stdvar_over_time",
               "present_over_time", "absent_over_time"}


def _key(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _drop_name(key: Labels) -> Labels:
    return tuple(kv for kv in key if kv[0] != "__name__")


def _unwrap(node: pp.Expr) -> pp.Expr:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def _elem_binop(op: str, lv: np.ndarray, rv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Value and keep-mask of `lv op rv`, as Prometheus' vectorElemBinop (comparisons keep lhs)."""
    with np.errstate(all="ignore"):
        if op == "+":
            return lv + rv, np.ones(lv.shape, bool)
        if op == "-":
            return lv - rv, np.ones(lv.shape, bool)
        if op == "*":
            return lv * rv, np.ones(lv.shape, bool)
        if op == "/":
            return lv / rv, np.ones(lv.shape, bool)
        if op == "%":
            return fn.go_mod(lv, rv), np.ones(lv.shape, bool)
        if op == "^":
            return fn.go_pow(lv, rv), np.ones(lv.shape, bool)
        if op == "atan2":
            return np.arctan2(lv, rv), np.ones(lv.shape, bool)
        cmp = {"==": np.equal, "!=": np.not_equal, ">": np.greater, "<": np.less,
               ">=": np.greater_equal, "<=": np.less_equal}[op]
        return lv, cmp(lv, rv)


class _Catalog:
    """The store's series table as label dicts, with selector results cached until it changes."""

    def __init__(self) -> None:
        self.version: tuple[int, int] | None = None
        self.sids: list[int] = []
        self.labels: list[dict[str, str]] = []
        self._match_cache: dict[tuple, list[int]] = {}
        self._regex: dict[str, re.Pattern] = {}

    def refresh(self, cur) -> None:
        version = cur.execute("SELECT count(*), coalesce(max(series_id), -1) FROM series").fetchall()[0]
        if version == self.version:
            return
        rows = cur.execute("SELECT series_id, instance, metric, labels FROM series").fetchall()
        self.sids, self.labels = [], []
        for sid, instance, metric, labels in rows:
            d = dict(labels) if labels else {}
            if instance:
                d["instance"] = instance
            d["__name__"] = metric
            self.sids.append(int(sid))
            self.labels.append(d)
        self._match_cache.clear()
        self.version = version

    def _re(self, pattern: str) -> re.Pattern:
        rx = self._regex.get(pattern)
        if rx is None:
            try:
                rx = re.compile(f"(?:{pattern})", re.DOTALL if False else 0)
            except re.error as e:
                raise PromQLError(f"invalid regular expression {pattern!r}: {e}") from e
            self._regex[pattern] = rx
        return rx

    def select(self, matchers: list[tuple[str, str, str]]) -> list[int]:
        """Indexes into sids/labels of the series matching every matcher (regexes fully anchored)."""
        cache_key = tuple(matchers)
        hit = self._match_cache.get(cache_key)
        if hit is not None:
            return hit
        out = []
        tests = []
        for name, op, value in matchers:
            if op == "=":
                tests.append(lambda d, n=name, v=value: d.get(n, "") == v)
            elif op == "!=":
                tests.append(lambda d, n=name, v=value: d.get(n, "") != v)
            elif op == "=~":
                rx = self._re(value)
                tests.append(lambda d, n=name, rx=rx: rx.fullmatch(d.get(n, "")) is not None)
            else:
                rx = self._re(value)
                tests.append(lambda d, n=name, rx=rx: rx.fullmatch(d.get(n, "")) is None)
        for i, d in enumerate(self.labels):
            if all(t(d) for t in tests):
                out.append(i)
        out.sort(key=lambda i: _key(self.labels[i]))
        self._match_cache[cache_key] = out
        return out


class _Ctx:
    def __init__(self, engine: "Engine", cur, grid: sql.Grid):
        self.engine = engine
        self.cur = cur
        self.grid = grid


class Engine:
    """Evaluates PromQL over a Store at an instant or over a range of steps."""

    def __init__(self, store, lookback_ms: int = 300_000):
        self.store = store
        self.lookback_ms = int(lookback_ms)
        self._catalog = _Catalog()
        # tests only: when True, aggregations note in `_order_sensitive` whether their answer depends on the
        # order series arrive in (Prometheus' own order is Go map iteration order, i.e. random)
        self._check_order = False
        self._order_sensitive = False

    # -- public API ---------------------------------------------------------------------------
    def instant(self, expr: str, t_ms: int) -> list[Sample] | float | list[Series]:
        """Evaluate at one time: a vector (list of Sample), a scalar (float), or a matrix (list of Series)."""
        node = parse(expr)
        cur = self.store.cursor()
        try:
            self._catalog.refresh(cur)
            ctx = _Ctx(self, cur, sql.Grid(np.array([int(t_ms)], dtype=np.int64)))
            top = _unwrap(node)
            if isinstance(top, pp.MatrixSelector):
                return self._matrix_result(top, ctx, int(t_ms))
            val = self._eval(node, ctx)
        finally:
            cur.close()
        if isinstance(val, np.ndarray):
            return float(val[0])
        if isinstance(val, _Str):
            raise Unsupported("unsupported: string-valued expression as a query result")
        out = [Sample(dict(val.keys[i]), float(val.v[i, 0])) for i in range(len(val.keys)) if val.ok[i, 0]]
        out.sort(key=lambda s: _key(s.labels))
        return out

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[Series]:
        """Evaluate at start, start+step, ... <= end; a scalar result is one series without labels."""
        if step_ms <= 0:
            raise PromQLError(f"step must be positive, got {step_ms} ms")
        if end_ms < start_ms:
            raise PromQLError(f"range end {end_ms} is before its start {start_ms}")
        node = parse(expr)
        if isinstance(_unwrap(node), (pp.MatrixSelector, pp.SubqueryExpr)):
            raise PromQLError("invalid expression type \"range vector\" for range query, "
                              "must be Scalar or instant Vector")
        t = np.arange(int(start_ms), int(end_ms) + 1, int(step_ms), dtype=np.int64)
        cur = self.store.cursor()
        try:
            self._catalog.refresh(cur)
            val = self._eval(node, _Ctx(self, cur, sql.Grid(t)))
        finally:
            cur.close()
        if isinstance(val, np.ndarray):
            return [Series({}, [(int(a), float(b)) for a, b in zip(t, val)])]
        if isinstance(val, _Str):
            raise Unsupported("unsupported: string-valued expression as a query result")
        out = []
        for i, key in enumerate(val.keys):
            mask = val.ok[i]
            if mask.any():
                out.append(Series(dict(key), [(int(a), float(b)) for a, b in zip(t[mask], val.v[i][mask])]))
        out.sort(key=lambda s: _key(s.labels))
        return out

    # -- evaluation ---------------------------------------------------------------------------
    def _eval(self, node: pp.Expr, ctx: _Ctx):
        n = ctx.grid.n
        if isinstance(node, pp.ParenExpr):
            return self._eval(node.expr, ctx)
        if isinstance(node, pp.NumberLiteral):
            return np.full(n, float(node.val))
        if isinstance(node, pp.StringLiteral):
            return _Str(node.val)
        if isinstance(node, pp.VectorSelector):
            return self._vector_selector(node, ctx)
        if isinstance(node, pp.MatrixSelector):
            raise PromQLError("a range vector (matrix selector) is only valid as a function argument "
                              "or as a whole instant query")
        if isinstance(node, pp.SubqueryExpr):
            raise Unsupported("unsupported: subquery")
        if isinstance(node, pp.UnaryExpr):
            val = self._eval(node.expr, ctx)
            if isinstance(val, np.ndarray):
                return -val
            return _dedupe(_Vec([_drop_name(k) for k in val.keys], -val.v, val.ok), whole_series=True)
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node, ctx)
        if isinstance(node, pp.AggregateExpr):
            return self._aggregate(node, ctx)
        if isinstance(node, pp.Call):
            return self._call(node, ctx)
        raise Unsupported(f"unsupported: expression {type(node).__name__}")

    def _select_series(self, sel: pp.VectorSelector) -> list[int]:
        check_at(sel)
        return self._catalog.select(matchers_of(sel))

    def _vector_selector(self, sel: pp.VectorSelector, ctx: _Ctx) -> _Vec:
        idx = self._select_series(sel)
        n = ctx.grid.n
        if not idx:
            return _Vec.empty(n)
        cat = self._catalog
        sids = [cat.sids[i] for i in idx]
        offset = duration_ms(sel.offset)
        lo = int(ctx.grid.t_ms.min()) - offset - self.lookback_ms
        hi = int(ctx.grid.t_ms.max()) - offset
        res = sql.instant_lookup(ctx.cur, self.store.samples_sql(lo, hi), sids, ctx.grid, offset, self.lookback_ms)
        row_of = {sid: r for r, sid in enumerate(sids)}
        v = np.zeros((len(sids), n))
        ok = np.zeros((len(sids), n), dtype=bool)
        ts = np.zeros((len(sids), n), dtype=np.int64)
        if len(res["step"]):
            rows = np.array([row_of[int(s)] for s in res["series_id"]], dtype=np.int64)
            steps = np.asarray(res["step"], dtype=np.int64)
            v[rows, steps] = np.asarray(res["value"], dtype=np.float64)
            ok[rows, steps] = True
            ts[rows, steps] = np.asarray(res["ts"], dtype=np.int64)
        return _Vec([_key(cat.labels[i]) for i in idx], v, ok, ts)

    def _matrix_result(self, ms: pp.MatrixSelector, ctx: _Ctx, t_ms: int) -> list[Series]:
        sel = ms.vector_selector
        idx = self._select_series(sel)
        if not idx:
            return []
        cat = self._catalog
        sids = [cat.sids[i] for i in idx]
        offset, rng = duration_ms(sel.offset), duration_ms(ms.range)
        res = sql.raw_window(ctx.cur, self.store.samples_sql(t_ms - offset - rng, t_ms - offset), sids,
                             t_ms, offset, rng)
        by_sid: dict[int, list[tuple[int, float]]] = {}
        for t, sid, val in zip(res["ts"].tolist(), res["series_id"].tolist(), res["value"].tolist()):
            by_sid.setdefault(int(sid), []).append((int(t), float(val)))
        out = [Series(dict(cat.labels[i]), by_sid[cat.sids[i]]) for i in idx if cat.sids[i] in by_sid]
        return out

    # -- binary operators ---------------------------------------------------------------------
    def _binary(self, node: pp.BinaryExpr, ctx: _Ctx):
        op = op_name(node.op)
        mod = node.modifier
        return_bool = bool(mod.return_bool) if mod is not None else False
        lhs = self._eval(node.lhs, ctx)
        rhs = self._eval(node.rhs, ctx)
        if isinstance(lhs, _Str) or isinstance(rhs, _Str):
            raise PromQLError(f"binary operator {op} is not defined on strings")
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            value, keep = _elem_binop(op, lhs, rhs)
            if op in COMPARISON:
                return keep.astype(np.float64)
            return value
        if isinstance(lhs, _Vec) and isinstance(rhs, np.ndarray):
            return _vector_scalar(op, lhs, rhs, swap=False, return_bool=return_bool)
        if isinstance(lhs, np.ndarray) and isinstance(rhs, _Vec):
            return _vector_scalar(op, rhs, lhs, swap=True, return_bool=return_bool)
        on, names, include = False, [], []
        card = pp.VectorMatchCardinality.OneToOne
        if mod is not None:
            card = mod.card
            if mod.matching is not None:
                on = mod.matching.type == pp.LabelModifierType.Include
                names = list(mod.matching.labels)
            include = list(mod.group_labels or [])
        if op in SET_OPS:
            return _set_op(op, lhs, rhs, on, names)
        return _vector_binop(op, lhs, rhs, card, on, names, include, return_bool)

    # -- aggregation --------------------------------------------------------------------------
    def _aggregate(self, node: pp.AggregateExpr, ctx: _Ctx):
        op = op_name(node.op)
        if op == "count_values":
            raise Unsupported("unsupported: aggregation count_values")
        vec = self._eval(node.expr, ctx)
        if not isinstance(vec, _Vec):
            raise PromQLError(f"expected an instant vector in aggregation {op}")
        param = self._eval(node.param, ctx) if node.param is not None else None
        without = False
        grouping: list[str] = []
        if node.modifier is not None:
            without = node.modifier.type == pp.AggModifierType.Without
            grouping = list(node.modifier.labels)
        if self._check_order and _order_sensitive(op, vec, grouping, without, param, ctx.grid.n):
            self._order_sensitive = True
        return _aggregate(op, vec, param, grouping, without, ctx.grid.n)

    # -- functions ----------------------------------------------------------------------------
    def _call(self, node: pp.Call, ctx: _Ctx):
        name = node.func.name
        n = ctx.grid.n
        args = list(node.args)
        if name in RANGE_FUNCS:
            return self._range_function(name, args, ctx)
        if name == "time":
            return ctx.grid.t_ms.astype(np.float64) / 1000
        if name == "pi":
            return np.full(n, math.pi)
        if name == "vector":
            s = self._scalar_arg(args[0], ctx, name)
            return _Vec([()], s.reshape(1, n).copy(), np.ones((1, n), dtype=bool))
        if name == "scalar":
            vec = self._vector_arg(args[0], ctx, name)
            count = vec.ok.sum(axis=0)
            vals = np.where(vec.ok, vec.v, 0.0).sum(axis=0) if len(vec.keys) else np.zeros(n)
            return np.where(count == 1, vals, math.nan)
        if name in fn.SIMPLE_MATH:
            vec = self._vector_arg(args[0], ctx, name)
            with np.errstate(all="ignore"):
                out = fn.SIMPLE_MATH[name](vec.v)
            return _dedupe(_Vec([_drop_name(k) for k in vec.keys], out, vec.ok), whole_series=False)
        if name in ("clamp", "clamp_min", "clamp_max"):
            vec = self._vector_arg(args[0], ctx, name)
            ok = vec.ok.copy()
            with np.errstate(all="ignore"):
                if name == "clamp":
                    lo, hi = self._scalar_arg(args[1], ctx, name), self._scalar_arg(args[2], ctx, name)
                    out = np.maximum(lo, np.minimum(hi, vec.v))
                    ok &= ~(hi < lo)
                elif name == "clamp_min":
                    out = np.maximum(self._scalar_arg(args[1], ctx, name), vec.v)
                else:
                    out = np.minimum(self._scalar_arg(args[1], ctx, name), vec.v)
            return _dedupe(_Vec([_drop_name(k) for k in vec.keys], out, ok), whole_series=False)
        if name == "round":
            vec = self._vector_arg(args[0], ctx, name)
            to = self._scalar_arg(args[1], ctx, name) if len(args) > 1 else np.ones(n)
            return _dedupe(_Vec([_drop_name(k) for k in vec.keys], fn.go_round(vec.v, to), vec.ok),
                           whole_series=False)
        if name in ("sort", "sort_desc"):
            return self._vector_arg(args[0], ctx, name)  # results are returned sorted by labels anyway
        if name == "timestamp":
            arg = _unwrap(args[0])
            vec = self._vector_arg(arg, ctx, name)
            if isinstance(arg, pp.VectorSelector) and vec.ts is not None:
                out = vec.ts.astype(np.float64) / 1000
            else:
                out = np.broadcast_to(ctx.grid.t_ms.astype(np.float64) / 1000, vec.v.shape).copy()
            return _dedupe(_Vec([_drop_name(k) for k in vec.keys], out, vec.ok), whole_series=False)
        if name == "absent":
            vec = self._vector_arg(args[0], ctx, name)
            missing = ~vec.ok.any(axis=0) if len(vec.keys) else np.ones(n, dtype=bool)
            return _Vec([_absent_labels(args[0])], np.ones((1, n)), missing.reshape(1, n))
        if name == "histogram_quantile":
            q = self._scalar_arg(args[0], ctx, name)
            return _histogram_quantile(q, self._vector_arg(args[1], ctx, name))
        if name == "label_replace":
            return _label_replace(self._vector_arg(args[0], ctx, name),
                                  *[self._string_arg(a, ctx, name) for a in args[1:5]])
        raise Unsupported(f"unsupported: function {name}")

    def _vector_arg(self, node: pp.Expr, ctx: _Ctx, fname: str) -> _Vec:
        val = self._eval(node, ctx)
        if not isinstance(val, _Vec):
            raise PromQLError(f"{fname}(): expected an instant vector argument")
        return val

    def _scalar_arg(self, node: pp.Expr, ctx: _Ctx, fname: str) -> np.ndarray:
        val = self._eval(node, ctx)
        if not isinstance(val, np.ndarray):
            raise PromQLError(f"{fname}(): expected a scalar argument")
        return val

    def _string_arg(self, node: pp.Expr, ctx: _Ctx, fname: str) -> str:
        val = self._eval(node, ctx)
        if not isinstance(val, _Str):
            raise PromQLError(f"{fname}(): expected a string argument")
        return val.value

    def _range_function(self, name: str, args: list, ctx: _Ctx) -> _Vec:
        n = ctx.grid.n
        mi = 1 if name == "quantile_over_time" else 0
        ms = _unwrap(args[mi])
        if isinstance(ms, pp.SubqueryExpr):
            raise Unsupported(f"unsupported: subquery (in {name})")
        if not isinstance(ms, pp.MatrixSelector):
            raise PromQLError(f"{name}(): expected a range vector argument")
        sel = ms.vector_selector
        idx = self._select_series(sel)
        cat = self._catalog
        if not idx:
            if name == "absent_over_time":
                return _Vec([_absent_labels(ms)], np.ones((1, n)), np.ones((1, n), dtype=bool))
            return _Vec.empty(n)
        sids = [cat.sids[i] for i in idx]
        offset, rng = duration_ms(sel.offset), duration_ms(ms.range)
        quantile_q = None
        scalar_param = None
        if name in ("quantile_over_time", "predict_linear"):
            scalar_param = self._scalar_arg(args[0] if name == "quantile_over_time" else args[1], ctx, name)
        if name == "quantile_over_time":
            if not np.all((scalar_param == scalar_param[0]) | (np.isnan(scalar_param) & np.isnan(scalar_param[0]))):
                raise Unsupported("unsupported: quantile_over_time with a quantile that varies over time")
            quantile_q = float(scalar_param[0])
        lo = int(ctx.grid.t_ms.min()) - offset - rng
        hi = int(ctx.grid.t_ms.max()) - offset
        if name == "quantile_over_time":
            # the only function that needs each window's values sorted: one SQL join of steps and samples
            res = sql.window_aggregates(ctx.cur, self.store.samples_sql(lo, hi), sids, ctx.grid, offset, rng,
                                        ["n", "quantile"], quantile=quantile_q)
            row_of = {sid: r for r, sid in enumerate(sids)}
            rows = np.array([row_of[int(s)] for s in res["series_id"]], dtype=np.int64)
            steps = np.asarray(res["step"], dtype=np.int64)
            values, good = _quantile_over_time(res, quantile_q)
        else:
            samples = sql.window_samples(ctx.cur, self.store.samples_sql(lo, hi), sids, lo, hi)
            ref = ctx.grid.t_ms - offset
            win = windows.locate(samples, ref, rng)
            rows, steps = win.rows, win.steps
            values, good = windows.range_function(
                name, samples, win, ctx.grid.t_ms[steps], ref[steps] - rng, ref[steps], rng / 1000,
                scalar_param[steps] if scalar_param is not None else None)
        if name == "absent_over_time":
            seen = np.zeros(n, dtype=bool)
            seen[steps] = True
            return _Vec([_absent_labels(ms)], np.ones((1, n)), ~seen.reshape(1, n))
        v = np.zeros((len(sids), n))
        ok = np.zeros((len(sids), n), dtype=bool)
        v[rows[good], steps[good]] = values[good]
        ok[rows[good], steps[good]] = True
        keys = [_key(cat.labels[i]) for i in idx]
        if name != "last_over_time":
            keys = [_drop_name(k) for k in keys]
        return _dedupe(_Vec(keys, v, ok), whole_series=True)


def _quantile_over_time(res: dict, q: float) -> tuple[np.ndarray, np.ndarray]:
    """quantile_over_time per window from its SQL answer; returns (values, ok)."""
    n = len(res["n"])
    ones = np.ones(n, dtype=bool)
    if math.isnan(q):
        return np.full(n, math.nan), ones
    if q < 0 or q > 1:
        return np.full(n, -math.inf if q < 0 else math.inf), ones
    col = res["q"]
    if isinstance(col, np.ma.MaskedArray):
        col = col.filled(np.nan)
    return np.asarray(col, dtype=np.float64), ones


def _dedupe(vec: _Vec, whole_series: bool) -> _Vec:
    """Merge rows with equal label sets; two of them present together is Prometheus' duplicate-labelset error.

    whole_series: Prometheus checks range-function and unary-minus results over the whole range,
    other results step by step.
    """
    groups: dict[Labels, list[int]] = {}
    for i, k in enumerate(vec.keys):
        groups.setdefault(k, []).append(i)
    if len(groups) == len(vec.keys):
        return vec
    keys, vs, oks = [], [], []
    for k, rows in groups.items():
        if len(rows) == 1:
            keys.append(k)
            vs.append(vec.v[rows[0]])
            oks.append(vec.ok[rows[0]])
            continue
        sub_ok = vec.ok[rows]
        live = [r for r in rows if vec.ok[r].any()]
        if (whole_series and len(live) > 1) or (sub_ok.sum(axis=0) > 1).any():
            raise PromQLError("vector cannot contain metrics with the same labelset")
        keys.append(k)
        vs.append(np.where(sub_ok, vec.v[rows], 0.0).sum(axis=0))
        oks.append(sub_ok.any(axis=0))
    n = vec.v.shape[1]
    return _Vec(keys, np.array(vs).reshape(len(keys), n), np.array(oks, dtype=bool).reshape(len(keys), n))


def _vector_scalar(op: str, vec: _Vec, s: np.ndarray, swap: bool, return_bool: bool) -> _Vec:
    if op in SET_OPS:
        raise PromQLError(f"set operator {op} not allowed between a vector and a scalar")
    lv, rv = (s[None, :], vec.v) if swap else (vec.v, s[None, :])
    value, keep = _elem_binop(op, np.broadcast_to(lv, vec.v.shape), np.broadcast_to(rv, vec.v.shape))
    if op in COMPARISON and swap:
        value = vec.v  # the vector element is kept even when it is the right operand
    ok = vec.ok.copy()
    if return_bool:
        value = keep.astype(np.float64)
    else:
        ok &= keep
    keys = vec.keys
    if op in ARITH or return_bool:
        keys = [_drop_name(k) for k in keys]
    return _dedupe(_Vec(keys, np.array(value, dtype=np.float64), ok), whole_series=False)


def _signature(key: Labels, on: bool, names: list[str]) -> tuple:
    if on:
        d = dict(key)
        return tuple((n, d.get(n, "")) for n in sorted(set(names)) if d.get(n, ""))
    drop = set(names) | {"__name__"}
    return tuple(kv for kv in key if kv[0] not in drop)


def _set_op(op: str, lhs: _Vec, rhs: _Vec, on: bool, names: list[str]) -> _Vec:
    n = lhs.v.shape[1]

    def presence(vec: _Vec) -> dict[tuple, np.ndarray]:
        out: dict[tuple, np.ndarray] = {}
        for i, k in enumerate(vec.keys):
            sig = _signature(k, on, names)
            out[sig] = out[sig] | vec.ok[i] if sig in out else vec.ok[i].copy()
        return out

    none = np.zeros(n, dtype=bool)
    if op in ("and", "unless"):
        right = presence(rhs)
        ok = lhs.ok.copy()
        for i, k in enumerate(lhs.keys):
            there = right.get(_signature(k, on, names), none)
            ok[i] &= there if op == "and" else ~there
        return _Vec(list(lhs.keys), lhs.v.copy(), ok)
    left = presence(lhs)
    r_ok = rhs.ok.copy()
    for j, k in enumerate(rhs.keys):
        r_ok[j] &= ~left.get(_signature(k, on, names), none)
    return _dedupe(_Vec(list(lhs.keys) + list(rhs.keys), np.vstack([lhs.v, rhs.v]),
                        np.vstack([lhs.ok, r_ok])), whole_series=False)


def _result_labels(lkey: Labels, rkey: Labels, op: str, one_to_one: bool, on: bool, names: list[str],
                   include: list[str]) -> Labels:
    d = dict(lkey)
    if op in ARITH:
        d.pop("__name__", None)
    if one_to_one:
        if on:
            d = {k: v for k, v in d.items() if k in names}
        else:
            for nm in names:
                d.pop(nm, None)
    r = dict(rkey)
    for ln in include:
        if r.get(ln, ""):
            d[ln] = r[ln]
        else:
            d.pop(ln, None)
    return _key(d)


def _vector_binop(op: str, lhs: _Vec, rhs: _Vec, card, on: bool, names: list[str], include: list[str],
                  return_bool: bool) -> _Vec:
    n = lhs.v.shape[1]
    one_to_many = card == pp.VectorMatchCardinality.OneToMany
    one_to_one = card == pp.VectorMatchCardinality.OneToOne
    many, one = (rhs, lhs) if one_to_many else (lhs, rhs)
    if not len(many.keys) or not len(one.keys):
        return _Vec.empty(n)
    one_groups: dict[tuple, list[int]] = {}
    for j, k in enumerate(one.keys):
        one_groups.setdefault(_signature(k, on, names), []).append(j)
    any_many = many.ok.any(axis=0)
    for sig, rows in one_groups.items():
        if len(rows) > 1 and ((one.ok[rows].sum(axis=0) > 1) & any_many).any():
            side = "left" if one_to_many else "right"
            raise PromQLError(f"found duplicate series for the match group {dict(sig)} on the {side} hand-side "
                              "of the operation; many-to-many matching not allowed: matching labels must be "
                              "unique on one side")
    keys, vs, oks, sigs = [], [], [], []
    for i, k in enumerate(many.keys):
        sig = _signature(k, on, names)
        for j in one_groups.get(sig, ()):
            m = many.ok[i] & one.ok[j]
            if not m.any():
                continue
            vl, vr = (one.v[j], many.v[i]) if one_to_many else (many.v[i], one.v[j])
            value, keep = _elem_binop(op, vl, vr)
            if return_bool:
                value, ok = keep.astype(np.float64), m
            else:
                ok = m & keep
            key = _result_labels(k, one.keys[j], op, one_to_one, on, names, include)
            if return_bool:
                key = _drop_name(key)
            keys.append(key)
            vs.append(np.asarray(value, dtype=np.float64))
            oks.append(ok)
            sigs.append(sig)
    if not keys:
        return _Vec.empty(n)
    ok_arr = np.array(oks, dtype=bool)
    # Prometheus refuses a match group that yields two results at one step
    per_group: dict[tuple, list[int]] = {}
    for r, (sig, key) in enumerate(zip(sigs, keys)):
        per_group.setdefault((sig,) if one_to_one else (sig, key), []).append(r)
    for rows in per_group.values():
        if len(rows) > 1 and (ok_arr[rows].sum(axis=0) > 1).any():
            if one_to_one:
                raise PromQLError("multiple matches for labels: many-to-one matching must be explicit "
                                  "(group_left/group_right)")
            raise PromQLError("multiple matches for labels: grouping labels must ensure unique matches")
    return _dedupe(_Vec(keys, np.array(vs), ok_arr), whole_series=False)


def _order_sensitive(op: str, vec: _Vec, grouping: list[str], without: bool, param, n: int) -> bool:
    """True when some input order of the series would change this aggregation's answer (tests only)."""
    import itertools

    groups: dict[Labels, list[int]] = {}
    for i, k in enumerate(vec.keys):
        groups.setdefault(_group_key(k, grouping, without), []).append(i)
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
        sub = _Vec([vec.keys[i] for i in rows], vec.v[rows], vec.ok[rows])
        want = _aggregate(op, sub, param, [], False, n)
        for perm in itertools.permutations(range(len(rows))):
            other = _aggregate(op, _Vec([sub.keys[i] for i in perm], sub.v[list(perm)], sub.ok[list(perm)]),
                               param, [], False, n)
            if not np.array_equal(want.v[want.ok], other.v[other.ok], equal_nan=True):
                return True
    return False


def _group_key(key: Labels, grouping: list[str], without: bool) -> Labels:
    if without:
        drop = set(grouping) | {"__name__"}
        return tuple(kv for kv in key if kv[0] not in drop)
    keep = set(grouping)
    return tuple(kv for kv in key if kv[0] in keep)


def _aggregate(op: str, vec: _Vec, param, grouping: list[str], without: bool, n: int) -> _Vec:
    groups: dict[Labels, list[int]] = {}
    for i, k in enumerate(vec.keys):
        groups.setdefault(_group_key(k, grouping, without), []).append(i)
    if op in ("topk", "bottomk"):
        return _topk(op, vec, groups, param, n)
    keys, vs, oks = [], [], []
    for gkey, rows in groups.items():
        V, P = vec.v[rows], vec.ok[rows]
        present = P.any(axis=0)
        if not present.any():
            continue
        with np.errstate(all="ignore"):
            if op == "sum":
                out = np.where(P, V, 0.0).sum(axis=0)
            elif op == "count":
                out = P.sum(axis=0).astype(np.float64)
            elif op == "group":
                out = np.ones(n)
            elif op in ("avg", "min", "max", "stddev", "stdvar"):
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
        return _Vec.empty(n)
    return _Vec(keys, np.array(vs), np.array(oks, dtype=bool))


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


def _topk(op: str, vec: _Vec, groups: dict[Labels, list[int]], param: np.ndarray, n: int) -> _Vec:
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
    return _Vec(list(vec.keys), vec.v.copy(), ok)


def _parse_le(text: str | None) -> float | None:
    """Go's strconv.ParseFloat for a bucket bound; None where Prometheus would skip the series."""
    if text is None or text != text.strip() or "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _histogram_quantile(q: np.ndarray, vec: _Vec) -> _Vec:
    n = vec.v.shape[1]
    groups: dict[Labels, list[tuple[float, int]]] = {}
    for i, k in enumerate(vec.keys):
        le = _parse_le(dict(k).get("le"))
        if le is None:
            continue
        sig = tuple(kv for kv in k if kv[0] != "le")  # the metric name stays in the grouping
        groups.setdefault(sig, []).append((le, i))
    keys, vs, oks = [], [], []
    for sig, members in groups.items():
        bounds = np.array([b for b, _ in members])
        rows = [i for _, i in members]
        P, V = vec.ok[rows], vec.v[rows]
        present = P.any(axis=0)
        out = np.full(n, math.nan)
        # steps sharing one presence pattern share the bucket layout; most ranges have one pattern
        patterns: dict[bytes, list[int]] = {}
        for t in np.nonzero(present)[0]:
            patterns.setdefault(P[:, t].tobytes(), []).append(int(t))
        for pat, steps in patterns.items():
            mask = np.frombuffer(pat, dtype=bool)
            cols = np.asarray(steps)
            out[cols] = fn.bucket_quantile_steps(q[cols], bounds[mask], V[mask][:, cols])
        keys.append(tuple(kv for kv in sig if kv[0] != "__name__"))
        vs.append(out)
        oks.append(present)
    if not keys:
        return _Vec.empty(n)
    return _dedupe(_Vec(keys, np.array(vs), np.array(oks, dtype=bool)), whole_series=False)


def _absent_labels(node: pp.Expr) -> Labels:
    """Labels absent() reports: the selector's equality matchers, as Prometheus derives them."""
    if isinstance(node, pp.MatrixSelector):
        node = node.vector_selector
    if not isinstance(node, pp.VectorSelector):
        return ()
    out: dict[str, str] = {}
    has: set[str] = set()
    for name, op, value in matchers_of(node):
        if name == "__name__":
            continue
        if op == "=" and name not in has:
            out[name] = value
            has.add(name)
        else:
            out.pop(name, None)
    return _key(out)


_GO_GROUP = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _label_replace(vec: _Vec, dst: str, repl: str, src: str, regex: str) -> _Vec:
    try:
        rx = re.compile(f"(?:{regex})")
    except re.error as e:
        raise PromQLError(f"invalid regular expression in label_replace(): {regex}") from e
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", dst):
        raise PromQLError(f"invalid destination label name in label_replace(): {dst}")
    keys = []
    for k in vec.keys:
        d = dict(k)
        m = rx.fullmatch(d.get(src, ""))
        if m is None:
            keys.append(k)
            continue

        def group(g: re.Match) -> str:
            name = g.group(1) or g.group(2)
            try:
                return m.group(int(name) if name.isdigit() else name) or ""
            except (IndexError, re.error):
                return ""

        res = _GO_GROUP.sub(group, repl)
        d.pop(dst, None)
        if res:
            d[dst] = res
        keys.append(_key(d))
    return _dedupe(_Vec(keys, vec.v, vec.ok), whole_series=False)

