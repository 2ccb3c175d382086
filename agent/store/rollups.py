"""Five-minute rollups of every series: what a long window's range functions need, without its samples.

A day of 16 vLLM servers scraped every second is 680 M samples; `increase(x[24h])` over them
needs, per series, only the first and last sample, how many there were and the value before
each counter reset. Per block of BLOCK_MS the `rollups` table keeps exactly that, plus
min/max/sum, so PromQL over a long window reads 288 rows a day per series and raw samples
only at the window's ragged edges (agent/promql/rollup_windows.py).

Blocks are rolled once complete and a little late (late scrapes land first), up to a watermark
kept in `rollup_watermark`. A write of samples older than the watermark deletes the blocks from
there on and lowers it, in the same transaction, so a rollup never disagrees with the samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import duckdb
import numpy as np

if TYPE_CHECKING:
    from vllm_sentinel.agent.store.db import Store

BLOCK_MS = 300_000
ROLL_DELAY_MS = 120_000  # a block is rolled this long after it ended: the last scrapes of it have landed
MAX_LISTED_RESETS = 8  # a counter restarts rarely; past this a gauge is dropping, and rate() of it needs no last bit
# blocks per call: the daemon's maintenance (every minute) needs one block in five minutes, and a store that
# has much to catch up (just upgraded) does it at two a minute, about 1.2 s of CPU each for 16 targets, not
# in one go beside the vLLM it watches; ingest and benches catch up an hour a round
BLOCKS_PER_ROUND = 2
CATCH_UP_BLOCKS = 12

TABLES = [
    # one row per series and block with a non-stale sample in it; resets: the corrections a counter's
    # resets inside the block add to last - first, in time order (the value before each drop; NULL when
    # none); n_resets: how many. A block with more drops than MAX_LISTED_RESETS (a gauge) keeps their sum.
    """CREATE TABLE rollups (
           series_id UINTEGER NOT NULL,
           block BIGINT NOT NULL,
           n INTEGER NOT NULL,
           first_ts BIGINT NOT NULL,
           first_v DOUBLE,
           last_ts BIGINT NOT NULL,
           last_v DOUBLE,
           min_v DOUBLE,
           max_v DOUBLE,
           sum_v DOUBLE,
           n_resets INTEGER NOT NULL,
           resets DOUBLE[])""",
    # every block that ends at or before until_ms is rolled (a single row)
    "CREATE TABLE rollup_watermark (until_ms BIGINT NOT NULL)",
    "INSERT INTO rollup_watermark VALUES (0)",
]


def _block_sql(samples_sql: str, lo: int, hi: int) -> str:
    """The rollup rows of the blocks in [lo, hi) (block-aligned), from the non-stale samples."""
    b = BLOCK_MS
    # Go compares NaN as neither smaller nor larger; DuckDB sorts NaN above every number, so guard it
    reset = "value < prev AND NOT isnan(value) AND NOT isnan(prev)"
    grouped = f"""
        SELECT series_id, block, count(*)::INTEGER AS n,
               min(ts) AS first_ts, arg_min(value, ts) AS first_v,
               max(ts) AS last_ts, arg_max(value, ts) AS last_v,
               coalesce(min(value) FILTER (WHERE NOT isnan(value)), 'NaN'::DOUBLE) AS min_v,
               coalesce(max(value) FILTER (WHERE NOT isnan(value)), 'NaN'::DOUBLE) AS max_v,
               sum(value) AS sum_v,
               CASE WHEN count(*) FILTER (WHERE {reset}) <= {MAX_LISTED_RESETS}
                    THEN list(prev ORDER BY ts) FILTER (WHERE {reset})
                    ELSE [sum(prev) FILTER (WHERE {reset})] END AS resets
        FROM (SELECT series_id, ts, value, ts // {b} AS block,
                     lag(value) OVER (PARTITION BY series_id, ts // {b} ORDER BY ts) AS prev
              FROM {samples_sql} WHERE ts >= {int(lo)} AND ts < {int(hi)} AND value IS NOT NULL)
        GROUP BY series_id, block"""
    cols = "series_id, block, n, first_ts, first_v, last_ts, last_v, min_v, max_v, sum_v"
    return f"SELECT {cols}, coalesce(len(resets), 0)::INTEGER AS n_resets, resets FROM ({grouped})"


def rolled_until(cur: duckdb.DuckDBPyConnection) -> int:
    """Every block ending at or before this time (ms) has its rollups; 0 when none."""
    row = cur.execute("SELECT max(until_ms) FROM rollup_watermark").fetchone()
    return int(row[0] or 0) if row else 0


def roll_up(store: "Store", until_ms: int, max_blocks: int = BLOCKS_PER_ROUND) -> int:
    """Roll the complete blocks after the watermark that end by until_ms, at most max_blocks; returns how many.

    A store with no rollups yet starts from its oldest sample.
    """
    with store._lock:
        con = store.con
        start = rolled_until(con)
        from vllm_sentinel.agent.store.db import HOUR_MS  # db imports this module: a late import
        # nothing stored between the watermark and the next hour that holds samples: skip that stretch
        first_hour = min((i for i, _ in store.partitions() if (i + 1) * HOUR_MS > start), default=None)
        if first_hour is None:
            return 0
        start = max(start, first_hour * HOUR_MS)
        end = min(until_ms // BLOCK_MS * BLOCK_MS, start + max_blocks * BLOCK_MS)
        if end <= start:
            return 0
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(f"INSERT INTO rollups {_block_sql(store.samples_sql(start, end - 1), start, end)}")
            con.execute("UPDATE rollup_watermark SET until_ms = ?", [end])
            con.execute("COMMIT")
        except BaseException:
            store._rollback()
            raise
        store._rolled_until = end
        return (end - start) // BLOCK_MS


def roll_up_all(store: "Store", until_ms: int) -> int:
    """Catch up in rounds until every complete block by until_ms is rolled; returns the blocks rolled."""
    total = 0
    while True:
        n = roll_up(store, until_ms, CATCH_UP_BLOCKS)
        if not n:
            return total
        total += n


def invalidate_from(con: duckdb.DuckDBPyConnection, ts_ms: int, watermark: int) -> int | None:
    """Samples at ts_ms were written: the blocks from ts_ms's on are no longer true. Returns the new watermark,
    or None when nothing changed. Run inside the writing transaction."""
    if ts_ms >= watermark:
        return None
    block = max(0, ts_ms) // BLOCK_MS
    con.execute("DELETE FROM rollups WHERE block >= ?", [block])
    con.execute("UPDATE rollup_watermark SET until_ms = ?", [block * BLOCK_MS])
    return block * BLOCK_MS


def drop_before(con: duckdb.DuckDBPyConnection, cutoff_ms: int) -> None:
    """Retention: the blocks that end at or before cutoff_ms go with their samples."""
    con.execute("DELETE FROM rollups WHERE (block + 1) * ? <= ?", [BLOCK_MS, cutoff_ms])


def read_blocks(cur: duckdb.DuckDBPyConnection, sids: list[int], b_lo: int, b_hi: int,
                corrections: bool = True) -> dict[str, np.ndarray]:
    """Rollup rows of the series for blocks in [b_lo, b_hi), ordered by (series_id, block), plus their
    resets flattened in order (`corrections`; row i's are the next n_resets[i] of them; with
    corrections=False none are read and n_resets is all zeros)."""
    # the ids as one list literal unnested: planned as a semi-join, faster than a long IN list
    ids = "[" + ",".join(str(int(s)) for s in sids) + "]::UINTEGER[]"
    where = f"series_id IN (SELECT unnest({ids})) AND block >= {int(b_lo)} AND block < {int(b_hi)}"
    rows = cur.execute(f"SELECT series_id, block, n, first_ts, first_v, last_ts, last_v, min_v, max_v, sum_v, "
                       f"n_resets FROM rollups WHERE {where}").fetchnumpy()
    order = np.lexsort((np.asarray(rows["block"]), np.asarray(rows["series_id"])))  # cheaper here than in SQL
    out = {k: np.asarray(v)[order] for k, v in rows.items()}
    if not corrections:
        out["n_resets"] = np.zeros(len(order), dtype=np.int64)
    if len(order) and out["n_resets"].any():
        flat = cur.execute(f"SELECT series_id, block, generate_subscripts(resets, 1) AS i, unnest(resets) AS c "
                           f"FROM rollups WHERE {where} AND n_resets > 0").fetchnumpy()
        order = np.lexsort((np.asarray(flat["i"]), np.asarray(flat["block"]), np.asarray(flat["series_id"])))
        out["corrections"] = np.asarray(flat["c"], dtype=np.float64)[order]
    else:
        out["corrections"] = np.zeros(0)
    return out
