"""SQL over the store's sample partitions for PromQL: per-step lookups and per-window aggregates in DuckDB.

Every query here is evaluated for a whole grid of evaluation steps at once (an instant query is
a grid of one step), so a range query costs one SQL statement per selector, not one per step.
Steps are given as reference times `ref` (evaluation time minus the selector's offset).
Semantics follow Prometheus 2.42: an instant lookup takes the newest sample in
[ref - lookback, ref] unless it is a staleness marker (value NULL); a range selector takes every
non-stale sample in [ref - range, ref] (both ends closed).
"""

from __future__ import annotations

import itertools

import duckdb
import numpy as np

_names = itertools.count()

# a staleness marker (the store's NULL value) among read values: Prometheus' own stale NaN bit pattern,
# which no arithmetic produces, so a window that keeps markers still holds plain float64 values
STALE_BITS = np.uint64(0x7FF0000000000002)
STALE_NAN = np.array([STALE_BITS], dtype=np.uint64).view(np.float64)[0]


def is_stale(values: np.ndarray) -> np.ndarray:
    """True where a value read with its staleness markers kept is a marker."""
    return np.asarray(values, dtype=np.float64).view(np.uint64) == STALE_BITS


def _values(col) -> np.ndarray:
    """A fetched value column as float64, NULL (a staleness marker) as STALE_NAN."""
    if isinstance(col, np.ma.MaskedArray):
        out = np.array(col.data, dtype=np.float64)
        out[np.ma.getmaskarray(col)] = STALE_NAN
        return out
    return np.asarray(col, dtype=np.float64)


def _register(cur: duckdb.DuckDBPyConnection, columns: dict[str, np.ndarray]) -> str:
    # DuckDB scans a dict of NumPy arrays in place (no pyarrow import on the read path)
    name = f"_promql_{next(_names)}"
    cur.register(name, columns)
    return name


def _steps_table(ref: np.ndarray) -> dict[str, np.ndarray]:
    return {"step": np.arange(len(ref), dtype=np.int32), "ref": np.asarray(ref, dtype=np.int64)}


def _filtered_samples(samples_sql: str, sids: list[int], lo: int, hi: int, keep_stale: bool) -> str:
    # series ids come from our own series table (integers), so inlining them is safe
    id_list = ",".join(str(int(s)) for s in sids)
    stale = "" if keep_stale else " AND value IS NOT NULL"
    return (f"SELECT ts, series_id, value FROM {samples_sql} "
            f"WHERE ts BETWEEN {int(lo)} AND {int(hi)} AND series_id IN ({id_list}){stale}")


def instant_lookup(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], ref: np.ndarray,
                   lookback_ms: int) -> dict[str, np.ndarray]:
    """Newest sample per (step, series) within the lookback; columns step, series_id, value, ts.

    Example: a sample at 10s and ref 20s with a 5m lookback -> one row (step 0, sid, v, 10000).
    A staleness marker as the newest sample yields no row, exactly as Prometheus.
    """
    lo, hi = int(ref.min()) - lookback_ms, int(ref.max())
    steps = _register(cur, _steps_table(ref))
    ids = _register(cur, {"sid": np.asarray(sids, dtype=np.uint32)})
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


# Aggregates computed per (step, series) window by joining steps with samples. Only
# quantile_over_time still goes this way (it needs each window's values sorted); every other range
# function is computed from samples read once (window_samples, then promql's windows.py).
_WINDOW_AGGS: dict[str, list[str]] = {
    "n": ["count(*) AS n"],
    # values in Prometheus' sort order for quantile(): NaN first, then ascending
    "quantile": ["list_concat(list_filter(list(value), lambda x: isnan(x)), "
                 "list_sort(list_filter(list(value), lambda x: NOT isnan(x)))) AS qs"],
}


def window_samples(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], lo: int,
                   hi: int, keep_stale: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Non-stale samples of the series in [lo, hi] as (rank, ts, value, rows), sorted by (rank, ts):
    rank orders the series by id, and series of rank r is sids[rows[r]]. keep_stale: staleness markers
    too, as STALE_NAN values (what an instant lookup needs to see).

    Example: sids [7, 3] -> the samples of series 3 first (rank 0, row 1), then those of series 7 (rank 1, row 0).
    """
    res = cur.execute(_filtered_samples(samples_sql, sids, lo, hi, keep_stale=keep_stale)).fetchnumpy()
    return _ranked(res, sids, lo, hi)


def interval_samples(cur: duckdb.DuckDBPyConnection, samples_sql_for, sids: list[int], intervals: list[tuple[int, int]]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """window_samples over several disjoint closed intervals at once; samples_sql_for(lo, hi) names the
    partitions each one reads (a long window's edges: a few minutes of samples each, not the day between)."""
    if not intervals:
        return window_samples(cur, samples_sql_for(0, 0), sids, 0, -1)
    sql = " UNION ALL ".join(_filtered_samples(samples_sql_for(a, b), sids, a, b, keep_stale=False)
                             for a, b in intervals)
    return _ranked(cur.execute(sql).fetchnumpy(), sids, intervals[0][0], max(b for _, b in intervals))


def _ranked(res: dict[str, np.ndarray], sids: list[int], lo: int, hi: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    by_sid = np.argsort(np.asarray(sids, dtype=np.int64), kind="stable")
    sorted_sids = np.asarray(sids, dtype=np.int64)[by_sid]
    rank = np.searchsorted(sorted_sids, np.asarray(res["series_id"], dtype=np.int64))
    ts = np.asarray(res["ts"], dtype=np.int64)
    val = _values(res["value"])
    # closed partitions are stored sorted by (series_id, ts) and scans keep that order, so the rows come
    # as a few sorted runs (one per hourly partition): a stable sort (timsort) merges them cheaply
    key = rank * (hi - lo + 1) + (ts - lo)
    if len(key) > 1 and not (key[1:] >= key[:-1]).all():
        order = np.argsort(key, kind="stable")
        rank, ts, val = rank[order], ts[order], val[order]
    return rank, ts, val, by_sid


def recent_samples(cur: duckdb.DuckDBPyConnection, samples_sql: str, lo: int, hi: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every series' samples in [lo, hi] as (series_id, ts, value), markers as STALE_NAN, in no set order."""
    got = cur.execute(f"SELECT ts, series_id, value FROM {samples_sql} "
                      f"WHERE ts BETWEEN {int(lo)} AND {int(hi)}").fetchnumpy()
    return (np.asarray(got["series_id"], dtype=np.int64), np.asarray(got["ts"], dtype=np.int64),
            _values(got["value"]))


def window_aggregates(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], ref: np.ndarray,
                      range_ms: int, wanted: list[str], quantile: float | None = None) -> dict[str, np.ndarray]:
    """Aggregates over each (step, series) window [ref-range, ref]; one row per non-empty window.

    Example: wanted=["n", "quantile"], quantile=0.5 -> columns step, series_id, n, q.
    """
    lo, hi = int(ref.min()) - range_ms, int(ref.max())
    cols = [c for w in wanted for c in _WINDOW_AGGS[w]]
    steps = _register(cur, _steps_table(ref))
    try:
        inner = f"""
            WITH s AS ({_filtered_samples(samples_sql, sids, lo, hi, keep_stale=False)}),
                 j AS (SELECT g.step, s.* FROM {steps} g
                       JOIN s ON s.ts >= g.ref - {int(range_ms)} AND s.ts <= g.ref)"""
        sql = f"{inner} SELECT step, series_id, {', '.join(cols)} FROM j GROUP BY step, series_id"
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


def raw_window(cur: duckdb.DuckDBPyConnection, samples_sql: str, sids: list[int], lo: int,
               hi: int) -> dict[str, np.ndarray]:
    """Non-stale samples of the series in [lo, hi], ordered by series and time."""
    sql = _filtered_samples(samples_sql, sids, lo, hi, keep_stale=False) + " ORDER BY series_id, ts"
    return cur.execute(sql).fetchnumpy()
