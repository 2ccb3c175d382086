"""SQL over the store's sample partitions: per-step lookups and per-window aggregates in DuckDB.

Every query here is evaluated for a whole grid of evaluation steps at once (an instant query is
a grid of one step), so a range query costs one SQL statement per selector, not one per step.
Semantics follow Prometheus 2.42: an instant lookup takes the newest sample in
[t - offset - lookback, t - offset] unless it is a staleness marker (value NULL); a range
selector takes every non-stale sample in [t - offset - range, t - offset] (both ends closed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

_names = itertools.count()


@dataclass
class Grid:
    """Evaluation times of one query: t_ms[i] for step i."""

    t_ms: np.ndarray  # int64

    @property
    def n(self) -> int:
        """Number of steps."""
        return len(self.t_ms)


def _register(cur: duckdb.DuckDBPyConnection, table: pa.Table) -> str:
    name = f"_promql_{next(_names)}"
    cur.register(name, table)
    return name


def _filtered_samples(samples_sql: str, sids: list[int], lo: int, hi: int, keep_stale: bool) -> str:
    # series ids come from our own series table (integers), so inlining them is safe
    id_list = ",".join(str(int(s)) for s in sids)
    stale = "" if keep_stale else " AND value IS NOT NULL"
    return (f"SELECT ts, series_id, value FROM {samples_sql} "
            f"WHERE ts BETWEEN {int(lo)} AND {int(hi)} AND series_id IN ({id_list}){stale}")


def instant_lookup(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], grid: Grid,
                   offset_ms: int, lookback_ms: int) -> dict[str, np.ndarray]:
    """Newest sample per (step, series) within the lookback; columns step, series_id, value, ts.

    Example: a sample at 10s and eval at 20s with a 5m lookback -> one row (step 0, sid, v, 10000).
    A staleness marker as the newest sample yields no row, exactly as Prometheus.
    """
    ref = grid.t_ms - offset_ms
    lo, hi = int(ref.min()) - lookback_ms, int(ref.max())
    steps = _register(cur, pa.table({"step": pa.array(np.arange(grid.n), pa.int32()),
                                     "ref": pa.array(ref, pa.int64())}))
    ids = _register(cur, pa.table({"sid": pa.array(sids, pa.uint32())}))
    try:
        sql = f"""
            WITH s AS ({_filtered_samples(samples_sql, sids, lo, hi, keep_stale=True)}),
                 g AS (SELECT step, ref, sid FROM {steps} CROSS JOIN {ids})
            SELECT g.step AS step, g.sid AS series_id, s.value AS value, s.ts AS ts
            FROM g ASOF JOIN s ON s.series_id = g.sid AND s.ts <= g.ref
            WHERE s.ts >= g.ref - {int(lookback_ms)} AND s.value IS NOT NULL"""
        return cur.execute(sql).fetchnumpy()
    finally:
        cur.unregister(steps)
        cur.unregister(ids)


# Aggregates computed per (step, series) window. `prev` is the previous non-stale sample of the
# series (which may lie before the window); `first_*` picks the first sample in the window.
_RESET = "(prev IS NOT NULL AND NOT isnan(value) AND NOT isnan(prev) AND value < prev)"
_CHANGE = ("(prev IS NOT NULL AND NOT (isnan(value) AND isnan(prev)) "
           "AND (value <> prev OR (isnan(value) <> isnan(prev))))")

_WINDOW_AGGS: dict[str, list[str]] = {
    "n": ["count(*) AS n"],
    "first": ["min(ts) AS t0", "arg_min(value, ts) AS v0"],
    "last": ["max(ts) AS t1", "arg_max(value, ts) AS v1"],
    "prev_of_last": ["arg_max(prev, ts) AS vp", "arg_max(prev_ts, ts) AS tp"],
    # counter-reset corrections after the first sample of the window, in time order
    # a pair (prev, value) counts only when prev lies inside the window too
    "reset_corr": [f"count(*) FILTER (WHERE {_RESET} AND prev_ts >= t_lo) AS n_resets",
                   f"arg_min(prev, ts) FILTER (WHERE {_RESET} AND prev_ts >= t_lo) AS first_corr"],
    "reset_list": [f"list(prev ORDER BY ts) FILTER (WHERE {_RESET} AND prev_ts >= t_lo) AS resets"],
    "resets": [f"count(*) FILTER (WHERE {_RESET} AND prev_ts >= t_lo) AS resets"],
    "changes": [f"count(*) FILTER (WHERE {_CHANGE} AND prev_ts >= t_lo) AS changes"],
    "sum": ["fsum(value) AS sum"],
    "min": ["min(value) FILTER (WHERE NOT isnan(value)) AS min"],
    "max": ["max(value) FILTER (WHERE NOT isnan(value)) AS max"],
    "nan_count": ["count(*) FILTER (WHERE isnan(value)) AS nans"],
    "values": ["list(value ORDER BY ts) AS vals", "list(ts ORDER BY ts) AS tss"],
    "var": ["var_pop(value) AS var"],
    # least squares over x = seconds since the first sample of the window (deriv) ...
    "regress_first": ["fsum((ts - t_lo_first) / 1e3) AS sx", "fsum(value) AS sy",
                      "fsum((ts - t_lo_first) / 1e3 * value) AS sxy",
                      "fsum(((ts - t_lo_first) / 1e3) * ((ts - t_lo_first) / 1e3)) AS sx2",
                      "arg_min(value, ts) AS y0",
                      "(count(DISTINCT value) = 1 AND count(*) FILTER (WHERE isnan(value)) = 0)::INTEGER AS const_y"],
    # ... or since the evaluation time (predict_linear)
    "regress_eval": ["fsum((ts - t_eval) / 1e3) AS sx", "fsum(value) AS sy",
                     "fsum((ts - t_eval) / 1e3 * value) AS sxy",
                     "fsum(((ts - t_eval) / 1e3) * ((ts - t_eval) / 1e3)) AS sx2",
                     "arg_min(value, ts) AS y0",
                     "(count(DISTINCT value) = 1 AND count(*) FILTER (WHERE isnan(value)) = 0)::INTEGER AS const_y"],
    # values in Prometheus' sort order for quantile(): NaN first, then ascending
    "quantile": ["list_concat(list_filter(list(value), lambda x: isnan(x)), "
                 "list_sort(list_filter(list(value), lambda x: NOT isnan(x)))) AS qs"],
}


def window_aggregates(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], grid: Grid,
                      offset_ms: int, range_ms: int, wanted: list[str],
                      quantile: float | None = None, eval_offset_ms: int = 0) -> dict[str, np.ndarray]:
    """Aggregates over each (step, series) window [t-offset-range, t-offset]; one row per non-empty window.

    Example: wanted=["n", "first", "last"] -> columns step, series_id, n, t0, v0, t1, v1.
    """
    ref = grid.t_ms - offset_ms
    lo, hi = int(ref.min()) - range_ms, int(ref.max())
    need_prev = any(w in wanted for w in ("prev_of_last", "reset_corr", "reset_list", "resets", "changes"))
    cols = [c for w in wanted for c in _WINDOW_AGGS[w]]
    steps = _register(cur, pa.table({"step": pa.array(np.arange(grid.n), pa.int32()),
                                     "ref": pa.array(ref, pa.int64())}))
    prev_cols = (", lag(value) OVER w AS prev, lag(ts) OVER w AS prev_ts" if need_prev else "")
    window = " WINDOW w AS (PARTITION BY series_id ORDER BY ts)" if need_prev else ""
    try:
        inner = f"""
            WITH raw AS ({_filtered_samples(samples_sql, sids, lo, hi, keep_stale=False)}),
                 s AS (SELECT ts, series_id, value{prev_cols} FROM raw{window}),
                 j AS (SELECT g.step, s.*, g.ref + {int(eval_offset_ms)} AS t_eval,
                              g.ref - {int(range_ms)} AS t_lo
                       FROM {steps} g JOIN s ON s.ts >= g.ref - {int(range_ms)} AND s.ts <= g.ref)"""
        if any("t_lo_first" in c for c in cols):
            # deriv's x axis starts at the first sample of each window
            inner += ", k AS (SELECT *, min(ts) OVER (PARTITION BY step, series_id) AS t_lo_first FROM j)"
            src = "k"
        else:
            src = "j"
        sql = f"{inner} SELECT step, series_id, {', '.join(cols)} FROM {src} GROUP BY step, series_id"
        if quantile is not None and 0 <= quantile <= 1:
            # Prometheus' quantile(): rank q*(n-1), weights applied as lower*(1-w) + upper*w
            q = f"{float(quantile)!r}::DOUBLE"  # a bare literal would be DECIMAL: exact, unlike Go
            sql = f"""SELECT * EXCLUDE (qs, lo, hi, w), qs[lo + 1] * (1 - w) + qs[hi + 1] * w AS q FROM (
                SELECT *, least(n - 1, lo + 1) AS hi FROM (
                    SELECT *, greatest(0, floor({q} * (n - 1)))::BIGINT AS lo,
                           {q} * (n - 1) - floor({q} * (n - 1)) AS w FROM ({sql})))"""
        return cur.execute(sql).fetchnumpy()
    finally:
        cur.unregister(steps)


def raw_window(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], t_ms: int,
               offset_ms: int, range_ms: int) -> dict[str, np.ndarray]:
    """Non-stale samples of the series in [t-offset-range, t-offset], ordered by series and time."""
    hi = t_ms - offset_ms
    sql = (_filtered_samples(samples_sql, sids, hi - range_ms, hi, keep_stale=False)
           + " ORDER BY series_id, ts")
    return cur.execute(sql).fetchnumpy()


def window_values(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], grid: Grid,
                  offset_ms: int, range_ms: int) -> dict[str, np.ndarray]:
    """Every sample of every (step, series) window, numbered in time order: step, series_id, pos, value.

    For functions whose Prometheus result depends on the order of floating-point operations
    (avg/stddev/stdvar_over_time), so they can be replayed exactly, vectorised across windows.
    """
    ref = grid.t_ms - offset_ms
    lo, hi = int(ref.min()) - range_ms, int(ref.max())
    steps = _register(cur, pa.table({"step": pa.array(np.arange(grid.n), pa.int32()),
                                     "ref": pa.array(ref, pa.int64())}))
    try:
        sql = f"""
            WITH s AS ({_filtered_samples(samples_sql, sids, lo, hi, keep_stale=False)})
            SELECT g.step AS step, s.series_id AS series_id,
                   (row_number() OVER (PARTITION BY g.step, s.series_id ORDER BY s.ts) - 1)::INTEGER AS pos,
                   s.value AS value
            FROM {steps} g JOIN s ON s.ts >= g.ref - {int(range_ms)} AND s.ts <= g.ref"""
        return cur.execute(sql).fetchnumpy()
    finally:
        cur.unregister(steps)
