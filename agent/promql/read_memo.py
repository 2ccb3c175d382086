"""Window reads of one engine over a store no one writes to, kept so a later read inside one is cut from it.

A replay asks the same selectors over the same window end many times, with starts that differ by the
rule's range and `for` (`rate(x[1m])`, `avg_over_time(x[5m])`, the same buckets in three rules): 85 reads,
67 distinct, for one instance's hour. A read whose series and end match a kept one that starts no later
is that one's rows from its start on, in the same (rank, ts) order: window_sql.window_samples' own answer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from vllm_sentinel.agent.store import window_sql

Window = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # (rank, ts, value, rows) as window_samples
KEEP_SAMPLES = 2_000_000  # about 48 MiB of kept columns at the most; the oldest reads go first


class WindowReads:
    """window_sql.window_samples, answered from a kept read with the same series and end where one covers it."""

    def __init__(self, keep_samples: int = KEEP_SAMPLES) -> None:
        self.keep_samples = keep_samples
        self._kept: OrderedDict[tuple[tuple[int, ...], int, bool], tuple[int, Window]] = OrderedDict()
        self._held = 0
        self.reads = self.cut = 0  # SQL reads made, answers cut from a kept read

    def samples(self, cur: Any, store: Any, sids: list[int], lo: int, hi: int, keep_stale: bool = False) -> Window:
        """Non-stale samples of the series in [lo, hi] (markers too with keep_stale), as window_samples."""
        key = (tuple(sids), int(hi), keep_stale)
        kept = self._kept.get(key)
        if kept is not None and kept[0] <= lo:
            self.cut += 1
            self._kept.move_to_end(key)
            return _from(kept[1], lo)
        self.reads += 1
        found = window_sql.window_samples(cur, store.samples_sql(lo, hi), sids, lo, hi, keep_stale=keep_stale)
        size = len(found[1])
        if size <= self.keep_samples:
            if kept is not None:
                self._held -= len(kept[1][1])
            self._kept[key] = (int(lo), found)
            self._kept.move_to_end(key)
            self._held += size
            while self._held > self.keep_samples:
                _, (_, old) = self._kept.popitem(last=False)
                self._held -= len(old[1])
            return _from(found, lo)
        return found


def _from(found: Window, lo: int) -> Window:
    """The rows with ts >= lo, order kept; copies even when all are kept, so no caller can change a kept read."""
    rank, ts, val, rows = found
    keep = ts >= lo
    return rank[keep], ts[keep], val[keep], rows.copy()
