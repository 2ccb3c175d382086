"""The engine's selectors: series chosen from the catalog, a vector selector's lookback, a matrix as a result."""

from __future__ import annotations

from typing import Any

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql.catalog import Catalog
from vllm_sentinel.agent.promql.eval_context import EvalContext
from vllm_sentinel.agent.promql.parser import check_at, duration_ms, matchers_of
from vllm_sentinel.agent.promql.query_results import Series
from vllm_sentinel.agent.promql.vectors import Vec
from vllm_sentinel.agent.promql.window_cache import WindowCache
from vllm_sentinel.agent.store import window_sql


class SelectorEval:
    """Engine's selectors (a mixin of engine.Engine, whose __init__ sets the fields below)."""

    store: Any  # the Store, or a view of one
    lookback_ms: int
    _catalog: Catalog
    _windows: WindowCache | None

    def _select_series(self, sel: pp.VectorSelector) -> list[int]:
        check_at(sel)
        return self._catalog.select(matchers_of(sel))

    def _vector_selector(self, sel: pp.VectorSelector, ctx: EvalContext) -> Vec:
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

    def _matrix_result(self, ms: pp.MatrixSelector, ctx: EvalContext, t_ms: int) -> list[Series]:
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
