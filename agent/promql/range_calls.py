"""The engine's range functions (rate, increase, *_over_time, ...): each window read, raw or from rollups,
and the function applied to it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql import rollup_windows, windows
from vllm_sentinel.agent.promql.catalog import Catalog
from vllm_sentinel.agent.promql.eval_context import EvalContext, unwrap
from vllm_sentinel.agent.promql.label_functions import absent_labels
from vllm_sentinel.agent.promql.parser import PromQLError, Unsupported, duration_ms
from vllm_sentinel.agent.promql.read_memo import WindowReads
from vllm_sentinel.agent.promql.vectors import Vec, dedupe
from vllm_sentinel.agent.promql.window_cache import WindowCache
from vllm_sentinel.agent.store import window_sql

RANGE_FUNCS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "resets", "changes",
               "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
               "last_over_time", "quantile_over_time", "stddev_over_time", "stdvar_over_time",
               "present_over_time", "absent_over_time"}


class RangeCalls:
    """Engine's range functions (a mixin of engine.Engine, whose __init__ sets the fields below)."""

    store: Any  # the Store, or a view of one
    rollups: bool
    rollups_used: bool
    _rollup_memo: dict
    _catalog: Catalog
    _windows: WindowCache | None
    _reads: WindowReads | None
    # SelectorEval's and FunctionCalls'
    _select_series: Callable[[pp.VectorSelector], list[int]]
    _scalar_arg: Callable[[pp.Expr, EvalContext, str], np.ndarray]

    def _rolled(self, name: str, ctx: EvalContext, sids: list[int], offset: int, rng: int):
        """(rows, steps, values, ok) from rollups when this engine reads them and the window is long; else None."""
        if not self.rollups or self._windows is not None or name not in rollup_windows.FUNCTIONS \
                or rng < rollup_windows.MIN_RANGE_MS or not getattr(self.store, "_rolled_until", 0):
            return None
        got = rollup_windows.evaluate(name, ctx.cur, self.store, sids, ctx.grid.t_ms - offset, rng, self._rollup_memo)
        if got is not None:
            self.rollups_used = True
        return got

    def _range_function(self, name: str, args: list, ctx: EvalContext) -> Vec:
        n = ctx.grid.n
        mi = 1 if name == "quantile_over_time" else 0
        ms = unwrap(args[mi])
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
