"""Range-selector windows kept between evaluations, for an engine that evaluates again and again at
advancing times (the daemon's rules every few seconds): each evaluation reads from the store only
the samples written since the previous one (the store's write log says which), not whole windows.

The answer is exactly window_sql.window_samples' for the same arguments: samples of the kept
window still inside [lo, hi] and older than anything written meanwhile, then the rows read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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


class WindowCache:
    """window_samples with the previous answer per (series, span) kept and topped up."""

    def __init__(self) -> None:
        self._kept: dict[tuple[tuple[int, ...], int], _Kept] = {}
        self._newest = 0
        self._block: tuple | None = None  # (start, hi, mark, series_id, ts, value): every series' newest samples

    def samples(self, cur: Any, store: Any, sids: list[int], lo: int, hi: int) -> Window:
        """Non-stale samples of the series in [lo, hi], as window_sql.window_samples returns them."""
        key = (tuple(sids), hi - lo)
        mark = store.writes.mark()
        kept = self._kept.get(key)
        start = lo
        if kept is not None and kept.lo <= lo and kept.hi <= hi:
            oldest = store.writes.oldest_since(kept.mark)
            start = kept.hi + 1 if oldest is None else min(kept.hi + 1, oldest)
            start = lo if start == EVERYTHING else max(lo, start)
        if kept is None or start == lo:
            found = window_sql.window_samples(cur, store.samples_sql(lo, hi), sids, lo, hi)
        elif start > hi:  # nothing written since, evaluated again at the same time
            found = _trim(kept.found, lo, start)
        else:
            found = _merge(_trim(kept.found, lo, start), self._recent(cur, store, sids, start, hi, mark))
        self._kept[key] = _Kept(lo, hi, mark, found)
        self._newest = max(self._newest, hi)
        for k in [k for k, v in self._kept.items() if v.hi < self._newest - EVICT_MS]:
            del self._kept[k]
        return found


    def _recent(self, cur: Any, store: Any, sids: list[int], start: int, hi: int, mark: int) -> Window:
        """The series' samples in [start, hi], sorted by (rank, ts), cut from one read of every series'.

        The windows of one evaluation all top up the same stretch of time: one query serves them all
        while nothing is written in between.
        """
        if self._block is None or self._block[:3] != (start, hi, mark):
            got = window_sql.recent_samples(cur, store.samples_sql(start, hi), start, hi)
            self._block = (start, hi, mark, np.asarray(got["series_id"], dtype=np.int64),
                           np.asarray(got["ts"], dtype=np.int64), np.asarray(got["value"], dtype=np.float64))
        sid, ts, val = self._block[3:]
        by_sid = np.argsort(np.asarray(sids, dtype=np.int64), kind="stable")
        sorted_sids = np.asarray(sids, dtype=np.int64)[by_sid]
        pos = np.minimum(np.searchsorted(sorted_sids, sid), len(sorted_sids) - 1)
        mine = sorted_sids[pos] == sid
        rank, ts, val = pos[mine], ts[mine], val[mine]
        order = np.argsort(rank * (hi - start + 1) + (ts - start), kind="stable")
        return rank[order], ts[order], val[order], by_sid


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
