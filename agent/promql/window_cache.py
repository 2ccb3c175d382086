"""Range-selector windows kept between evaluations, for an engine that evaluates again and again at
advancing times (the daemon's rules every few seconds): each evaluation reads from the store only
the samples written since the previous one (the store's write log says which), not whole windows.

The answer is exactly window_sql.window_samples' for the same arguments: samples of the kept
window still inside [lo, hi] and older than anything written meanwhile, then the rows read again.
Instant lookups (a plain selector: the newest sample within the 5-minute lookback) are served the
same way, from a kept lookback window that also holds the staleness markers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_sentinel.agent.promql import windows
from vllm_sentinel.agent.store import window_sql
from vllm_sentinel.agent.store.write_log import EVERYTHING

EVICT_MS = 60_000  # a window not asked for over a minute of evaluation time is forgotten

Window = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # (rank, ts, value, rows) as window_samples


@dataclass
class _Kept:
    lo: int
    hi: int
    mark: int  # the store's write-log position when it was read
    found: Window
    asked: int = 0  # the newest window end any query had reached when this one was last asked for


class WindowCache:
    """window_samples with the previous answer per (series, span, offset) kept and topped up."""

    def __init__(self) -> None:
        self._kept: dict[tuple[tuple[int, ...], int, int, bool], _Kept] = {}
        self._newest = 0
        # every series' samples in (start, hi), read once for all the windows that top up that stretch while
        # the store's write log stays at _blocks_mark (offset windows top up another stretch: a block of their own)
        self._blocks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._blocks_mark = -1

    def samples(self, cur: Any, store: Any, sids: list[int], lo: int, hi: int, offset: int = 0,
                keep_stale: bool = False) -> Window:
        """Non-stale samples of the series in [lo, hi], as window_sql.window_samples returns them.

        offset tells apart windows of the same series and span at different times (`[10m]` and
        `[10m] offset 1m` in one rule), which would otherwise replace each other at every evaluation.
        keep_stale: staleness markers too, as window_sql.STALE_NAN values.
        """
        key = (tuple(sids), hi - lo, offset, keep_stale)
        mark = store.writes.mark()
        kept = self._kept.get(key)
        start = lo
        if kept is not None and kept.lo <= lo and kept.hi <= hi:
            oldest = store.writes.oldest_since(kept.mark)
            start = kept.hi + 1 if oldest is None else min(kept.hi + 1, oldest)
            start = lo if start == EVERYTHING else max(lo, start)
        if kept is None or start == lo:
            found = window_sql.window_samples(cur, store.samples_sql(lo, hi), sids, lo, hi, keep_stale=keep_stale)
        elif start > hi:  # nothing written since, evaluated again at the same time
            found = _trim(kept.found, lo, start)
        else:
            found = _merge(_trim(kept.found, lo, start), self._recent(cur, store, sids, start, hi, mark, keep_stale))
        self._newest = max(self._newest, hi)
        self._kept[key] = _Kept(lo, hi, mark, found, self._newest)
        # by when it was last asked, not by its end: an offset window ends a minute or more behind the others
        for k in [k for k, v in self._kept.items() if v.asked < self._newest - EVICT_MS]:
            del self._kept[k]
        return found

    def instant_lookup(self, cur: Any, store: Any, sids: list[int], ref: np.ndarray, lookback_ms: int,
                       offset: int = 0) -> dict[str, np.ndarray]:
        """window_sql.instant_lookup's answer, from a kept window of the lookback that holds the markers."""
        lo, hi = int(ref.min()) - lookback_ms, int(ref.max())
        rank, ts, val, rows = self.samples(cur, store, sids, lo, hi, offset=offset, keep_stale=True)
        win = windows.locate(windows.Samples(rank, ts, val, rows), ref, lookback_ms)
        newest = win.b  # the newest sample of each (step, series) window, unless it is a marker
        fresh = ~window_sql.is_stale(val[newest])
        return {"step": win.steps[fresh], "series_id": np.asarray(sids, dtype=np.int64)[win.rows[fresh]],
                "value": val[newest][fresh], "ts": ts[newest][fresh]}

    def _recent(self, cur: Any, store: Any, sids: list[int], start: int, hi: int, mark: int,
                keep_stale: bool) -> Window:
        """The series' samples in [start, hi], sorted by (rank, ts), cut from one read of every series'.

        The windows of one evaluation top up the same stretch of time or a few: one query per stretch
        serves them all while nothing is written in between.
        """
        if self._blocks_mark != mark:
            self._blocks, self._blocks_mark = {}, mark
        block = self._blocks.get((start, hi))
        if block is None:
            sid, ts, val = window_sql.recent_samples(cur, store.samples_sql(start, hi), start, hi)
            order = np.lexsort((ts, sid))  # by (series, time) once: a window then cuts its series' runs out
            block = self._blocks[(start, hi)] = (sid[order], ts[order], val[order])
        sid, ts, val = block
        wanted = np.asarray(sids, dtype=np.int64)
        by_sid = np.argsort(wanted, kind="stable")
        first = np.searchsorted(sid, wanted[by_sid], side="left")
        count = np.searchsorted(sid, wanted[by_sid], side="right") - first
        # rows of rank r are first[r] .. first[r] + count[r] - 1, taken in rank order: (rank, ts) order already
        rank = np.repeat(np.arange(len(wanted), dtype=np.int64), count)
        at = np.arange(len(rank), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count) + first[rank]
        ts, val = ts[at], val[at]
        if not keep_stale:
            fresh = ~window_sql.is_stale(val)
            rank, ts, val = rank[fresh], ts[fresh], val[fresh]
        return rank, ts, val, by_sid


def _trim(found: Window, lo: int, before: int) -> Window:
    """The rows with lo <= ts < before, order kept."""
    rank, ts, val, rows = found
    keep = (ts >= lo) & (ts < before)
    return rank[keep], ts[keep], val[keep], rows


def _merge(old: Window, new: Window) -> Window:
    """Both sorted by (rank, ts), every old ts before every new one: one stable sort by rank merges them."""
    rank = np.concatenate([old[0], new[0]])
    ts = np.concatenate([old[1], new[1]])
    val = np.concatenate([old[2], new[2]])
    if len(old[0]) and len(new[0]):
        order = np.argsort(rank, kind="stable")  # two sorted runs: timsort merges them in one pass
        rank, ts, val = rank[order], ts[order], val[order]
    return rank, ts, val, new[3]
