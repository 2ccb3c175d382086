"""PromQL evaluated over the DuckDB store, with Prometheus 2.42's numbers.

Every expression is evaluated for a grid of steps at once: an instant-vector value is a matrix of
(series x steps) values plus a presence mask, so a range query runs one SQL statement per selector
and numpy operations per node, never a Python loop over raw samples. This module holds the Engine
and its queries (instant, instant_many, range); it evaluates each node by the mixins of
node_eval.py (dispatch, operators, aggregations), selector_eval.py (selectors),
function_calls.py and range_calls.py (functions). The vector algebra is in vectors.py,
binary_ops.py, aggregation.py, histograms.py and label_functions.py, the SQL over the sample
partitions in the store's window_sql.py.

    engine = Engine(store)
    engine.instant('sum by (instance) (rate(vllm:prompt_tokens_total[1m]))', t_ms)
    engine.range('vllm:num_requests_waiting > 0', start_ms, end_ms, 5_000)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql.catalog import Catalog, shared_catalogs
from vllm_sentinel.agent.promql.eval_context import EvalContext, Grid, unwrap
from vllm_sentinel.agent.promql.function_calls import FunctionCalls
from vllm_sentinel.agent.promql.node_eval import NodeEval
from vllm_sentinel.agent.promql.parser import PromQLError, Unsupported, parse
from vllm_sentinel.agent.promql.query_results import Sample, Series, instant_answer, range_answer
from vllm_sentinel.agent.promql.range_calls import RangeCalls
from vllm_sentinel.agent.promql.read_memo import WindowReads
from vllm_sentinel.agent.promql.selector_eval import SelectorEval
from vllm_sentinel.agent.promql.window_cache import WindowCache

__all__ = ["Engine", "Sample", "Series", "PromQLError", "Unsupported"]

PARSED_KEEP = 2048  # parsed expressions an engine keeps (a rule pack and its evidence: a few hundred)
# instant queries of one expression at times this close share one read of their windows (instant_many)
SHARED_READ_MS = 900_000


class Engine(NodeEval, SelectorEval, FunctionCalls, RangeCalls):
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
            ctx = EvalContext(self, cur, Grid(np.array([int(t_ms)], dtype=np.int64)))
            top = unwrap(node)
            if isinstance(top, pp.MatrixSelector):
                return self._matrix_result(top, ctx, int(t_ms))
            val = self._eval(node, ctx)
        finally:
            cur.close()
        return instant_answer(val, 0)

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
            if len(asked) == 1 or isinstance(unwrap(node), pp.MatrixSelector):
                for i in asked:
                    out[i] = self.instant(expr, queries[i][1])
                continue
            times = sorted({int(queries[i][1]) for i in asked})
            answers: dict[int, Any] = {}
            for group in _close_together(times, SHARED_READ_MS):
                val = self._eval_at(node, np.array(group, dtype=np.int64))
                answers.update({tk: instant_answer(val, j) for j, tk in enumerate(group)})
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
        if isinstance(unwrap(node), (pp.MatrixSelector, pp.SubqueryExpr)):
            raise PromQLError("invalid expression type \"range vector\" for range query, "
                              "must be Scalar or instant Vector")
        t = np.arange(int(start_ms), int(end_ms) + 1, int(step_ms), dtype=np.int64)
        return range_answer(self._eval_at(node, t), t)

    def _eval_at(self, node: pp.Expr, t: np.ndarray):
        """The expression over the grid of times t, on the catalog current at the start."""
        cur = self.store.cursor()
        try:
            self._catalog = self._catalogs.current(cur, self._series_version())
            return self._eval(node, EvalContext(self, cur, Grid(t)))
        finally:
            cur.close()

    def _series_version(self) -> tuple[int, int] | None:
        # the live engine reads the writer's own store, whose series ids are dense from 0: no query needed
        if self._windows is None:
            # a file no writer can touch while it is open: the catalog loaded once stays current
            return self._catalogs.version if getattr(self.store, "series_fixed", False) else None
        n = self.store.series_count
        return (n, n - 1)


def _close_together(times: list[int], span_ms: int) -> list[list[int]]:
    """Sorted times cut into runs no longer than span_ms: [0, 1, 50, 51] with span 10 -> [[0, 1], [50, 51]]."""
    runs: list[list[int]] = []
    for t in times:
        if runs and t - runs[-1][0] <= span_ms:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs
