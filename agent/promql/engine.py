"""PromQL evaluated over the DuckDB store, with Prometheus 2.42's numbers.

Every expression is evaluated for a grid of steps at once: an instant-vector value is a matrix of
(series x steps) values plus a presence mask, so a range query runs one SQL statement per selector
and numpy operations per node, never a Python loop over raw samples. This module parses, selects
series and dispatches each node; the vector algebra (operators, matching, aggregations) is in
algebra.py, the SQL over the sample partitions in the store's window_sql.py.

    engine = Engine(store)
    engine.instant('sum by (instance) (rate(vllm:prompt_tokens_total[1m]))', t_ms)
    engine.range('vllm:num_requests_waiting > 0', start_ms, end_ms, 5_000)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql import functions as fn
from vllm_sentinel.agent.promql import windows
from vllm_sentinel.agent.promql import rollup_windows
from vllm_sentinel.agent.promql.algebra import (COMPARISON, SET_OPS, Str, Vec, absent_labels, aggregate, dedupe,
                                                drop_names, elem_binop, histogram_quantile, label_replace,
                                                labels_key, order_sensitive, set_op, vector_binop, vector_scalar)
from vllm_sentinel.agent.promql.parser import (PromQLError, Unsupported, check_at, duration_ms, matchers_of,
                                               op_name, parse)
from vllm_sentinel.agent.promql.catalog import Catalog, shared_catalogs
from vllm_sentinel.agent.promql.window_cache import WindowCache
from vllm_sentinel.agent.promql.read_memo import WindowReads
from vllm_sentinel.agent.store import window_sql

__all__ = ["Engine", "Sample", "Series", "PromQLError", "Unsupported"]



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



PARSED_KEEP = 2048  # parsed expressions an engine keeps (a rule pack and its evidence: a few hundred)
# instant queries of one expression at times this close share one read of their windows (instant_many)
SHARED_READ_MS = 900_000

RANGE_FUNCS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "resets", "changes",
               "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
               "last_over_time", "quantile_over_time", "stddev_over_time", "stdvar_over_time",
               "present_over_time", "absent_over_time"}


def _unwrap(node: pp.Expr) -> pp.Expr:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node




@dataclass
class Grid:
    """Evaluation times of one query: t_ms[i] for step i."""

    t_ms: np.ndarray  # int64

    @property
    def n(self) -> int:
        """Number of steps."""
        return len(self.t_ms)


class _Ctx:
    def __init__(self, engine: "Engine", cur, grid: Grid):
        self.engine = engine
        self.cur = cur
        self.grid = grid


class Engine:
    """Evaluates PromQL over a Store at an instant or over a range of steps."""

    def __init__(self, store, lookback_ms: int = 300_000, incremental: bool = False, rollups: bool = False):
        self.store = store
        # rollups: range functions over long windows read the store's five-minute rollups for whole blocks
        # (rollup_windows.py); sum/avg_over_time then equal the raw answer only to rounding, so rule
        # evaluation and the promtool differential keep them off. rollups_used says whether any answer did.
        self.rollups = rollups
        self.rollups_used = False
        self._rollup_memo: dict = {}  # windows' pieces for the next queries over the same series and window
        self.lookback_ms = int(lookback_ms)
        # one catalog per store: diagnose's engines (replay, evidence, summary, 16 inferred configs) load it once
        self._catalogs = shared_catalogs(store)
        self._catalog = Catalog()  # the one this engine's current query uses
        # incremental: evaluated again and again at advancing times (the daemon's rules): range windows are
        # kept and topped up with what the store wrote since, instead of read whole each time
        self._windows = WindowCache() if incremental else None
        # a file no one writes to while it is open (diagnose's own): a window read inside an earlier one is cut from it
        self._reads = WindowReads() if not incremental and getattr(store, "series_fixed", False) else None
        # tests only: when True, aggregations note in `_order_sensitive` whether their answer depends on the
        # order series arrive in (Prometheus' own order is Go map iteration order, i.e. random)
        self._check_order = False
        self._order_sensitive = False
        self._parsed: dict[str, pp.Expr] = {}  # the daemon asks the same expressions every few seconds

    def _parse(self, expr: str) -> pp.Expr:
        """The expression's tree, parsed once per engine (the evaluator never changes a tree)."""
        node = self._parsed.get(expr)
        if node is None:
            if len(self._parsed) >= PARSED_KEEP:
                self._parsed.clear()
            node = self._parsed[expr] = parse(expr)
        return node

    # -- public API ---------------------------------------------------------------------------
    def instant(self, expr: str, t_ms: int) -> list[Sample] | float | list[Series]:
        """Evaluate at one time: a vector (list of Sample), a scalar (float), or a matrix (list of Series)."""
        node = self._parse(expr)
        cur = self.store.cursor()
        try:
            self._catalog = self._catalogs.current(cur, self._series_version())
            ctx = _Ctx(self, cur, Grid(np.array([int(t_ms)], dtype=np.int64)))
            top = _unwrap(node)
            if isinstance(top, pp.MatrixSelector):
                return self._matrix_result(top, ctx, int(t_ms))
            val = self._eval(node, ctx)
        finally:
            cur.close()
        return _instant_answer(val, 0)

    def instant_many(self, queries: list[tuple[str, int]]) -> list[list[Sample] | float | list[Series]]:
        """Many instant queries, each answer as instant() gives it; the same expression asked at times
        close together is evaluated once over those times (one read of their windows, not one each).

        Incident evidence asks a few expressions at each incident's peak: hundreds of instant
        queries over a day, a handful of evaluations here.
        """
        out: list = [None] * len(queries)
        by_expr: dict[str, list[int]] = {}
        for i, (expr, _t) in enumerate(queries):
            by_expr.setdefault(expr, []).append(i)
        for expr, asked in by_expr.items():
            node = self._parse(expr)
            if len(asked) == 1 or isinstance(_unwrap(node), pp.MatrixSelector):
                for i in asked:
                    out[i] = self.instant(expr, queries[i][1])
                continue
            times = sorted({int(queries[i][1]) for i in asked})
            answers: dict[int, Any] = {}
            for group in _close_together(times, SHARED_READ_MS):
                val = self._eval_at(node, np.array(group, dtype=np.int64))
                answers.update({tk: _instant_answer(val, j) for j, tk in enumerate(group)})
            for i in asked:
                out[i] = answers[int(queries[i][1])]
        return out

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[Series]:
        """Evaluate at start, start+step, ... <= end; a scalar result is one series without labels."""
        if step_ms <= 0:
            raise PromQLError(f"step must be positive, got {step_ms} ms")
        if end_ms < start_ms:
            raise PromQLError(f"range end {end_ms} is before its start {start_ms}")
        node = self._parse(expr)
        if isinstance(_unwrap(node), (pp.MatrixSelector, pp.SubqueryExpr)):
            raise PromQLError("invalid expression type \"range vector\" for range query, "
                              "must be Scalar or instant Vector")
        t = np.arange(int(start_ms), int(end_ms) + 1, int(step_ms), dtype=np.int64)
        val = self._eval_at(node, t)
        if isinstance(val, np.ndarray):
            return [Series({}, [(int(a), float(b)) for a, b in zip(t, val)])]
        if isinstance(val, Str):
            raise Unsupported("unsupported: string-valued expression as a query result")
        out = []
        for i, key in enumerate(val.keys):
            mask = val.ok[i]
            if mask.any():
                out.append(Series(dict(key), [(int(a), float(b)) for a, b in zip(t[mask], val.v[i][mask])]))
        out.sort(key=lambda s: labels_key(s.labels))
        return out

    def _eval_at(self, node: pp.Expr, t: np.ndarray):
        """The expression over the grid of times t, on the catalog current at the start."""
        cur = self.store.cursor()
        try:
            self._catalog = self._catalogs.current(cur, self._series_version())
            return self._eval(node, _Ctx(self, cur, Grid(t)))
        finally:
            cur.close()

    def _series_version(self) -> tuple[int, int] | None:
        # the live engine reads the writer's own store, whose series ids are dense from 0: no query needed
        if self._windows is None:
            # a file no writer can touch while it is open: the catalog loaded once stays current
            return self._catalogs.version if getattr(self.store, "series_fixed", False) else None
        n = self.store.series_count
        return (n, n - 1)

    # -- evaluation ---------------------------------------------------------------------------
    def _eval(self, node: pp.Expr, ctx: _Ctx):
        n = ctx.grid.n
        if isinstance(node, pp.ParenExpr):
            return self._eval(node.expr, ctx)
        if isinstance(node, pp.NumberLiteral):
            return np.full(n, float(node.val))
        if isinstance(node, pp.StringLiteral):
            return Str(node.val)
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
            return dedupe(Vec(drop_names(val.keys), -val.v, val.ok), whole_series=True)
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

    def _vector_selector(self, sel: pp.VectorSelector, ctx: _Ctx) -> Vec:
        idx = self._select_series(sel)
        n = ctx.grid.n
        if not idx:
            return Vec.empty(n)
        cat = self._catalog
        sids = [cat.sids[i] for i in idx]
        offset = duration_ms(sel.offset)
        lo = int(ctx.grid.t_ms.min()) - offset - self.lookback_ms
        hi = int(ctx.grid.t_ms.max()) - offset
        if self._windows is not None:  # the daemon's rules: the lookback kept and topped up, not scanned again
            res = self._windows.instant_lookup(ctx.cur, self.store, sids, ctx.grid.t_ms - offset, self.lookback_ms,
                                               offset)
        else:
            res = window_sql.instant_lookup(ctx.cur, self.store.samples_sql(lo, hi), sids, ctx.grid.t_ms - offset,
                                            self.lookback_ms)
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
        return Vec(cat.keys(idx, keep_name=True), v, ok, ts)

    def _matrix_result(self, ms: pp.MatrixSelector, ctx: _Ctx, t_ms: int) -> list[Series]:
        sel = ms.vector_selector
        idx = self._select_series(sel)
        if not idx:
            return []
        cat = self._catalog
        sids = [cat.sids[i] for i in idx]
        offset, rng = duration_ms(sel.offset), duration_ms(ms.range)
        lo, hi = t_ms - offset - rng, t_ms - offset
        res = window_sql.raw_window(ctx.cur, self.store.samples_sql(lo, hi), sids, lo, hi)
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
        if op != "or" and isinstance(lhs, Vec) and not lhs.ok.any() and not _is_string(node.rhs):
            # every operator but `or` keeps only left-hand series (or right-hand ones matched to one): an
            # empty left side gives an empty result whatever the right side holds. Most alert rules read
            # `condition and on (...) more conditions`; while the first finds nothing (a healthy fleet) the
            # rest, often the costliest windows (a 10-minute baseline), are not evaluated.
            return Vec.empty(ctx.grid.n)
        rhs = self._eval(node.rhs, ctx)
        if isinstance(lhs, Str) or isinstance(rhs, Str):
            raise PromQLError(f"binary operator {op} is not defined on strings")
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            value, keep = elem_binop(op, lhs, rhs)
            if op in COMPARISON:
                return keep.astype(np.float64)
            return value
        if isinstance(lhs, Vec) and isinstance(rhs, np.ndarray):
            return vector_scalar(op, lhs, rhs, swap=False, return_bool=return_bool)
        if isinstance(lhs, np.ndarray) and isinstance(rhs, Vec):
            return vector_scalar(op, rhs, lhs, swap=True, return_bool=return_bool)
        on, names, include = False, [], []
        card = pp.VectorMatchCardinality.OneToOne
        if mod is not None:
            card = mod.card
            if mod.matching is not None:
                on = mod.matching.type == pp.LabelModifierType.Include
                names = list(mod.matching.labels)
            include = list(mod.group_labels or [])
        if op in SET_OPS:
            return set_op(op, lhs, rhs, on, names)
        return vector_binop(op, lhs, rhs, card, on, names, include, return_bool)

    # -- aggregation --------------------------------------------------------------------------
    def _aggregate(self, node: pp.AggregateExpr, ctx: _Ctx):
        op = op_name(node.op)
        if op == "count_values":
            raise Unsupported("unsupported: aggregation count_values")
        vec = self._eval(node.expr, ctx)
        if not isinstance(vec, Vec):
            raise PromQLError(f"expected an instant vector in aggregation {op}")
        param = self._eval(node.param, ctx) if node.param is not None else None
        without = False
        grouping: list[str] = []
        if node.modifier is not None:
            without = node.modifier.type == pp.AggModifierType.Without
            grouping = list(node.modifier.labels)
        if self._check_order and order_sensitive(op, vec, grouping, without, param, ctx.grid.n):
            self._order_sensitive = True
        return aggregate(op, vec, param, grouping, without, ctx.grid.n)

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
            return Vec([()], s.reshape(1, n).copy(), np.ones((1, n), dtype=bool))
        if name == "scalar":
            vec = self._vector_arg(args[0], ctx, name)
            count = vec.ok.sum(axis=0)
            vals = np.where(vec.ok, vec.v, 0.0).sum(axis=0) if len(vec.keys) else np.zeros(n)
            return np.where(count == 1, vals, math.nan)
        if name in fn.SIMPLE_MATH:
            vec = self._vector_arg(args[0], ctx, name)
            with np.errstate(all="ignore"):
                out = fn.SIMPLE_MATH[name](vec.v)
            return dedupe(Vec(drop_names(vec.keys), out, vec.ok), whole_series=False)
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
            return dedupe(Vec(drop_names(vec.keys), out, ok), whole_series=False)
        if name == "round":
            vec = self._vector_arg(args[0], ctx, name)
            to = self._scalar_arg(args[1], ctx, name) if len(args) > 1 else np.ones(n)
            return dedupe(Vec(drop_names(vec.keys), fn.go_round(vec.v, to), vec.ok),
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
            return dedupe(Vec(drop_names(vec.keys), out, vec.ok), whole_series=False)
        if name == "absent":
            vec = self._vector_arg(args[0], ctx, name)
            missing = ~vec.ok.any(axis=0) if len(vec.keys) else np.ones(n, dtype=bool)
            return Vec([absent_labels(args[0])], np.ones((1, n)), missing.reshape(1, n))
        if name == "histogram_quantile":
            q = self._scalar_arg(args[0], ctx, name)
            return histogram_quantile(q, self._vector_arg(args[1], ctx, name))
        if name == "label_replace":
            return label_replace(self._vector_arg(args[0], ctx, name),
                                  *[self._string_arg(a, ctx, name) for a in args[1:5]])
        raise Unsupported(f"unsupported: function {name}")

    def _vector_arg(self, node: pp.Expr, ctx: _Ctx, fname: str) -> Vec:
        val = self._eval(node, ctx)
        if not isinstance(val, Vec):
            raise PromQLError(f"{fname}(): expected an instant vector argument")
        return val

    def _scalar_arg(self, node: pp.Expr, ctx: _Ctx, fname: str) -> np.ndarray:
        val = self._eval(node, ctx)
        if not isinstance(val, np.ndarray):
            raise PromQLError(f"{fname}(): expected a scalar argument")
        return val

    def _string_arg(self, node: pp.Expr, ctx: _Ctx, fname: str) -> str:
        val = self._eval(node, ctx)
        if not isinstance(val, Str):
            raise PromQLError(f"{fname}(): expected a string argument")
        return val.value

    def _rolled(self, name: str, ctx: _Ctx, sids: list[int], offset: int, rng: int):
        """(rows, steps, values, ok) from rollups when this engine reads them and the window is long; else None."""
        if not self.rollups or self._windows is not None or name not in rollup_windows.FUNCTIONS \
                or rng < rollup_windows.MIN_RANGE_MS or not getattr(self.store, "_rolled_until", 0):
            return None
        got = rollup_windows.evaluate(name, ctx.cur, self.store, sids, ctx.grid.t_ms - offset, rng, self._rollup_memo)
        if got is not None:
            self.rollups_used = True
        return got

    def _range_function(self, name: str, args: list, ctx: _Ctx) -> Vec:
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
                return Vec([absent_labels(ms)], np.ones((1, n)), np.ones((1, n), dtype=bool))
            return Vec.empty(n)
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
            res = window_sql.window_aggregates(ctx.cur, self.store.samples_sql(lo, hi), sids, ctx.grid.t_ms - offset,
                                               rng, ["n", "quantile"], quantile=quantile_q)
            row_of = {sid: r for r, sid in enumerate(sids)}
            rows = np.array([row_of[int(s)] for s in res["series_id"]], dtype=np.int64)
            steps = np.asarray(res["step"], dtype=np.int64)
            values, good = _quantile_over_time(res, quantile_q)
        elif (rolled := self._rolled(name, ctx, sids, offset, rng)) is not None:
            rows, steps, values, good = rolled
        else:
            if self._windows is not None:
                found = self._windows.samples(ctx.cur, self.store, sids, lo, hi, offset)
            elif self._reads is not None:
                found = self._reads.samples(ctx.cur, self.store, sids, lo, hi)
            else:
                found = window_sql.window_samples(ctx.cur, self.store.samples_sql(lo, hi), sids, lo, hi)
            samples = windows.Samples(*found)
            ref = ctx.grid.t_ms - offset
            win = windows.locate(samples, ref, rng)
            rows, steps = win.rows, win.steps
            values, good = windows.range_function(
                name, samples, win, ctx.grid.t_ms[steps], ref[steps] - rng, ref[steps], rng / 1000,
                scalar_param[steps] if scalar_param is not None else None)
        if name == "absent_over_time":
            seen = np.zeros(n, dtype=bool)
            seen[steps] = True
            return Vec([absent_labels(ms)], np.ones((1, n)), ~seen.reshape(1, n))
        v = np.zeros((len(sids), n))
        ok = np.zeros((len(sids), n), dtype=bool)
        v[rows[good], steps[good]] = values[good]
        ok[rows[good], steps[good]] = True
        keys = cat.keys(idx, keep_name=name == "last_over_time")
        return dedupe(Vec(keys, v, ok), whole_series=True)


def _instant_answer(val, j: int) -> list[Sample] | float:
    """Step j of an evaluation as an instant query's answer: a scalar, or the vector's samples by labels."""
    if isinstance(val, np.ndarray):
        return float(val[j])
    if isinstance(val, Str):
        raise Unsupported("unsupported: string-valued expression as a query result")
    out = [Sample(dict(val.keys[i]), float(val.v[i, j])) for i in range(len(val.keys)) if val.ok[i, j]]
    out.sort(key=lambda s: labels_key(s.labels))
    return out


def _close_together(times: list[int], span_ms: int) -> list[list[int]]:
    """Sorted times cut into runs no longer than span_ms: [0, 1, 50, 51] with span 10 -> [[0, 1], [50, 51]]."""
    runs: list[list[int]] = []
    for t in times:
        if runs and t - runs[-1][0] <= span_ms:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


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


def _is_string(node: pp.Expr) -> bool:
    """A string literal, parentheses aside: the one operand a binary operator refuses even beside nothing."""
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return isinstance(node, pp.StringLiteral)
