"""Reads of samples joined to their series, over the hourly partitions a window touches."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from vllm_sentinel.agent.store import rollups


def instances_with_samples(store: Any, start_ms: int, end_ms: int) -> list[str]:
    """Instances with at least one sample in (start_ms, end_ms], sorted.

    Whole five-minute blocks already rolled up are answered by their rollup rows (a day of samples is
    not scanned to list 16 names); there a block holding only staleness markers does not count.
    """
    block = rollups.BLOCK_MS
    b1 = (start_ms + 1 + block - 1) // block  # the first block wholly after start_ms
    b2 = min((end_ms + 1) // block, getattr(store, "_rolled_until", 0) // block)
    if b2 <= b1:
        parts = [f"SELECT series_id FROM {store.samples_sql(start_ms, end_ms)} "
                 f"WHERE ts > {int(start_ms)} AND ts <= {int(end_ms)}"]
    else:
        lo, hi = b1 * block, b2 * block
        parts = [f"SELECT series_id FROM rollups WHERE block >= {int(b1)} AND block < {int(b2)}",
                 f"SELECT series_id FROM {store.samples_sql(start_ms, lo - 1)} "
                 f"WHERE ts > {int(start_ms)} AND ts < {int(lo)}",
                 f"SELECT series_id FROM {store.samples_sql(hi, end_ms)} WHERE ts >= {int(hi)} AND ts <= {int(end_ms)}"]
    rows = store.cursor().execute(
        f"SELECT DISTINCT s.instance FROM ({' UNION ALL '.join(parts)}) x JOIN series s USING (series_id) "
        "ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def samples_of_metrics(store: Any, metrics: Iterable[str] | None, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Samples in [lo, hi] (staleness markers included) of the named metrics, or of every metric when None;
    columns ts, instance, metric, labels_text, value, grouped by instance."""
    names = None if metrics is None else sorted(metrics)
    where = "" if names is None else f"AND se.metric IN ({', '.join('?' * len(names))})"
    return store.cursor().execute(
        f"SELECT s.ts, se.instance, se.metric, se.labels_text, s.value FROM {store.samples_sql(lo, hi)} s "
        f"JOIN series se ON s.series_id = se.series_id WHERE s.ts >= ? AND s.ts <= ? {where} "
        f"ORDER BY se.instance", [lo, hi, *(names or [])]).fetchnumpy()


def values_between(store: Any, start_ms: int, end_ms: int) -> list[tuple[int, int, float]]:
    """(series_id, ts, value) of every sample in (start_ms, end_ms] that is not a staleness marker,
    by series then time."""
    return store.cursor().execute(
        f"SELECT series_id, ts, value FROM {store.samples_sql(start_ms, end_ms)} "
        "WHERE ts > ? AND ts <= ? AND value IS NOT NULL ORDER BY series_id, ts", [start_ms, end_ms]).fetchall()


RECENT_MS = 60_000  # newest_labels looks here first: an info metric scraped every tick is always there


def newest_labels(store: Any, metric: str, instance: str, at_ms: int, lookback_ms: int) -> dict[str, str] | None:
    """Labels of the newest non-stale sample of `metric` on `instance` in (at_ms - lookback_ms, at_ms]; among
    series sampled at that time, the lowest `engine` label wins.

    The last minute is read first and the whole lookback only when it holds no sample: the daemon asks
    this for every target every 30 s, and an hour of samples is millions of rows.
    """
    cur = store.cursor()
    sids = [r[0] for r in cur.execute("SELECT series_id FROM series WHERE metric = ? AND instance = ?",
                                      [metric, instance]).fetchall()]
    if not sids:
        return None
    ids = ",".join(str(int(s)) for s in sids)  # our own series table's integers
    for span in sorted({min(RECENT_MS, lookback_ms), lookback_ms}):
        row = cur.execute(
            f"SELECT s.labels FROM {store.samples_sql(at_ms - span, at_ms)} p JOIN series s "
            f"ON p.series_id = s.series_id WHERE p.series_id IN ({ids}) AND p.ts <= ? AND p.ts > ? "
            "AND p.value IS NOT NULL ORDER BY p.ts DESC, s.labels['engine'] ASC LIMIT 1",
            [at_ms, at_ms - span]).fetchone()
        if row:
            return dict(row[0])
    return None
