"""The Store's writes: a scrape tick (or a dump's columns) in one transaction, and its undo when that fails.

A failed call leaves the store as it was: refused samples are counted before the transaction, and a
failed transaction hands back the series ids and partitions it took. A fatal DuckDB error
invalidates the connection; the next write reopens the file first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import duckdb
import numpy as np

from vllm_sentinel.agent.store import rollups
from vllm_sentinel.agent.store.connection import COMMITTED_ANYWAY, invalidating, open_connection, unwritable
from vllm_sentinel.agent.store.crash_points import stall
from vllm_sentinel.agent.store.migrations import migrate
from vllm_sentinel.agent.store.partitions import HOUR_MS, PARTITION_COLUMNS, partition_name
from vllm_sentinel.agent.store.sample_checks import (MAX_TS_MS, MIN_TS_MS, Refusals, Rejected, describe_labels,
                                                     describe_timestamp, timestamp_ok)
from vllm_sentinel.agent.store.store_errors import SamplesRejected, StoreError, StoreUnwritable
from vllm_sentinel.agent.store.write_frames import samples_frames, series_frame
from vllm_sentinel.agent.store.write_log import WriteLog
from vllm_sentinel.collectors.base import Batch, Event, format_labels
from vllm_sentinel.collectors.exposition import parse_labels

_LAYOUTS_MAX = 10_000  # batch layouts kept (one per target and collector); cleared when more appear


class TickWrites:
    """Store's write side (a mixin of db.Store, whose __init__ sets the fields below)."""

    con: duckdb.DuckDBPyConnection
    path: str
    read_only: bool
    archive_folder: Path | None
    writes: WriteLog
    _lock: threading.RLock
    _series: dict[tuple[str, str, str], int]
    _layouts: dict[tuple, tuple[list[str], list[str], list[int]]]
    _canonical: dict[tuple[str, str, str], int]
    _next_id: int
    _partitions: dict[int, bool]
    _archives: dict[int, str]
    _invalidated: str | None
    _rolled_until: int
    # db.Store's and PartitionReads'
    _load: Callable[[], None]
    _rollback: Callable[[], None]
    _refresh_view: Callable[[], None]

    def append(self, batch: Batch) -> int:
        """Store one batch in one transaction; returns the number of samples written."""
        return self.append_many([batch])

    def append_many(self, batches: Iterable[Batch], rejected: list[Rejected] | None = None) -> int:
        """Store several batches (one scrape tick) in one transaction, built as Arrow columns.

        Samples the store cannot hold (time outside 1970..2262, malformed or repeated label names) are
        refused before the transaction: with `rejected` given they are listed there and the rest is
        stored; without it SamplesRejected is raised and nothing is stored. A file that cannot be
        written raises StoreUnwritable. Either way a failed call leaves the store as it was.
        """
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only; writes go through the daemon.")
        batches = list(batches)
        with self._lock:
            self._reconnect_if_invalidated()
            mark = (self._next_id, dict(self._partitions))
            try:
                ts_col, sid_col, val_col, new_series, events, refused = self._columns(batches)
                if refused and rejected is None:
                    raise SamplesRejected(refused.all())
                if rejected is not None:
                    rejected.extend(refused.all())
                if not ts_col and not events and not new_series:
                    return 0
                hours = self._write(ts_col, sid_col, val_col, new_series, events)
            except BaseException:
                self._undo(*mark)
                raise
            for idx in hours:
                self._partitions[idx] = False
            if ts_col:
                self.writes.note(min(ts_col))
            return len(ts_col)

    def append_columns(self, series: list[tuple[str, str, str, str]], codes: np.ndarray, ts: np.ndarray,
                       values: np.ndarray) -> int:
        """Store samples given as columns in one transaction: `series` holds (instance, metric, label text,
        source name) per distinct series, `codes` each sample's index in it; every time must fit the store.

        The bulk path of a dump's plain lines (`ingest`); a series whose labels the store refuses raises
        SamplesRejected and nothing is stored."""
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only; writes go through the daemon.")
        if len(ts) and not (MIN_TS_MS <= int(ts.min()) and int(ts.max()) <= MAX_TS_MS):
            raise ValueError("append_columns takes times inside 1970..2262 only")
        with self._lock:
            self._reconnect_if_invalidated()
            mark = (self._next_id, dict(self._partitions))
            try:
                new_series: list = []
                ids = np.empty(len(series), dtype=np.uint32)
                refused = Refusals()
                for i, (instance, metric, text, source) in enumerate(series):
                    sid = self._series.get((instance, metric, text))
                    if sid is None:
                        try:
                            sid = self._new_series_id(instance, metric, text, source, new_series)
                        except ValueError as e:
                            refused.add(0, instance, "labels", describe_labels(metric, text, e))
                            continue
                        self._series[(instance, metric, text)] = sid
                    ids[i] = sid
                if refused.total:
                    raise SamplesRejected(refused.all())
                if not len(ts) and not new_series:
                    return 0
                hours = self._write(ts, ids[codes], values, new_series, [])
            except BaseException:
                self._undo(*mark)
                raise
            for idx in hours:
                self._partitions[idx] = False
            if len(ts):
                self.writes.note(int(ts.min()))
            return len(ts)

    def _columns(self, batches: list[Batch]) -> tuple:
        """The tick as columns, with new series interned; refused samples are counted, not columned."""
        ts_col: list[int] = []
        sid_col: list[int] = []
        val_col: list[float | None] = []
        new_series: list[tuple[int, str, str, dict[str, str], str, str]] = []
        events: list[Event] = []
        refused = Refusals()
        cache = self._series
        layouts = self._layouts
        for i, b in enumerate(batches):
            events.extend(b.events)
            instance, default_ts = b.instance, b.ts_ms
            n = len(b.metrics)
            # a target sends the same series in the same order every scrape: its series ids are the last ones
            untimed = b.timestamps_ms.count(None) == n
            key = (instance, n, b.metrics[0], b.metrics[-1]) if n and untimed else None
            layout = layouts.get(key) if key is not None else None
            if layout is not None and layout[0] == b.metrics and layout[1] == b.labels and timestamp_ok(default_ts):
                ts_col.extend([default_ts] * n)
                sid_col.extend(layout[2])
                val_col.extend(b.values)
                continue
            first, before = len(sid_col), refused.total
            for metric, text, value, t in zip(b.metrics, b.labels, b.values, b.timestamps_ms):
                ts = default_ts if t is None else t
                if not timestamp_ok(ts):
                    refused.add(i, instance, "timestamp", describe_timestamp(metric, text, ts))
                    continue
                key_ = (instance, metric, text)
                sid = cache.get(key_)
                if sid is None:
                    try:
                        sid = self._new_series_id(instance, metric, text, b.sources.get(metric, metric), new_series)
                    except ValueError as e:
                        refused.add(i, instance, "labels", describe_labels(metric, text, e))
                        continue
                    cache[key_] = sid
                ts_col.append(ts)
                sid_col.append(sid)
                val_col.append(value)
            if key is not None and refused.total == before:
                if len(layouts) >= _LAYOUTS_MAX:
                    layouts.clear()
                layouts[key] = (list(b.metrics), list(b.labels), sid_col[first:])
        return ts_col, sid_col, val_col, new_series, events, refused

    def _write(self, ts_col: list[int] | np.ndarray, sid_col: list[int] | np.ndarray,
               val_col: list[float | None] | np.ndarray,
               new_series: list, events: list[Event]) -> list[int]:
        """One transaction: new partitions, new series, the samples, the events; returns the hours written."""
        frames = samples_frames(ts_col, sid_col, val_col)
        if isinstance(ts_col, np.ndarray):  # append_columns'
            first, last = (int(ts_col.min()), int(ts_col.max())) if len(ts_col) else (0, 0)
            hours = [first // HOUR_MS] if first // HOUR_MS == last // HOUR_MS else np.unique(ts_col // HOUR_MS).tolist()
        else:
            first, last = min(ts_col, default=0), max(ts_col, default=0)
            hours = ([first // HOUR_MS] if first // HOUR_MS == last // HOUR_MS
                     else sorted({t // HOUR_MS for t in ts_col}))
        con = self.con
        rolled = None
        try:
            con.execute("BEGIN TRANSACTION")
            for idx in hours:
                if idx not in self._partitions:
                    self._create_partition(idx)
            if new_series:
                con.register("_new_series", series_frame(new_series))
                con.execute("INSERT INTO series SELECT series_id, instance, metric, "
                            "MAP(label_keys::VARCHAR[], label_values::VARCHAR[]), labels_text, source_metric "
                            "FROM _new_series")
                con.unregister("_new_series")
            for frame, value_sql in frames:
                con.register("_batch", frame)
                if len(hours) == 1:
                    con.execute(f"INSERT INTO {partition_name(hours[0])} SELECT ts, series_id, {value_sql} FROM _batch")
                else:
                    for idx in hours:
                        con.execute(f"INSERT INTO {partition_name(idx)} SELECT ts, series_id, {value_sql} FROM _batch "
                                    f"WHERE ts >= {idx * HOUR_MS} AND ts < {(idx + 1) * HOUR_MS}")
                con.unregister("_batch")
            for idx in hours:
                if self._partitions.get(idx):
                    con.execute("UPDATE partitions SET sorted = false WHERE idx = ?", [idx])
            rolled = rollups.invalidate_from(con, first, self._rolled_until) if len(ts_col) else None
            if events:
                con.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", [
                    (e.ts_ms, e.instance, e.kind, e.labels, e.message) for e in events])
            stall("append:before_commit")
            con.execute("COMMIT")
            if rolled is not None:
                self._rolled_until = rolled
        except duckdb.Error as e:
            if invalidating(e):
                # DuckDB stops serving this connection after a fatal error, so reopen before the next write
                self._invalidated = str(e).splitlines()[0][:200]
                if COMMITTED_ANYWAY in str(e):
                    if rolled is not None:
                        self._rolled_until = rolled
                    return hours  # only the checkpoint after the commit failed: the tick is in the WAL, stored
            if unwritable(e) or self._invalidated:
                raise StoreUnwritable(
                    f"cannot write {self.path}: {str(e).splitlines()[0][:200]}. Free space on its disk "
                    "(or point --db at a disk with room); writing resumes by itself") from e
            raise
        return hours

    def _reconnect_if_invalidated(self) -> None:
        """Reopen the file after DuckDB invalidated the connection (a fatal write error such as a full disk).

        What is on disk is what was committed, so the series and partition caches are read again from it.
        """
        if self._invalidated is None:
            return
        try:
            self.con.close()
        except duckdb.Error:
            pass  # an invalidated connection may refuse even to close; reopening is what matters
        try:
            con = open_connection(self.path, read_only=False)
            migrate(con)
        except (StoreError, duckdb.Error) as e:
            raise StoreUnwritable(f"cannot reopen {self.path} after a failed write ({self._invalidated}): "
                                  f"{str(e).splitlines()[0][:200]}. Free space on its disk; writing resumes by "
                                  "itself") from e
        self.con, self._invalidated = con, None
        self._series, self._canonical, self._partitions, self._archives = {}, {}, {}, {}
        self._layouts = {}
        self._load()

    def _undo(self, first_new_id: int, partitions: dict[int, bool]) -> None:
        """After a failed write: end the transaction if one is left and forget what it handed out."""
        self._rollback()
        # series ids handed out in the failed call are handed out again, to the series that next needs one
        self._layouts.clear()  # they may hold ids handed out in the failed call
        if self._next_id != first_new_id:
            self._series = {k: v for k, v in self._series.items() if v < first_new_id}
            self._canonical = {k: v for k, v in self._canonical.items() if v < first_new_id}
            self._next_id = first_new_id
        self._partitions = partitions

    def _new_series_id(self, instance: str, metric: str, text: str, source: str, new_series: list) -> int:
        # label text from different writers may order labels differently: canonicalise once per series
        labels = parse_labels(text)
        labels.pop("instance", None)
        canonical = format_labels(labels)
        sid = self._canonical.get((instance, metric, canonical))
        if sid is None:
            sid = self._next_id
            self._next_id += 1
            self._canonical[(instance, metric, canonical)] = sid
            new_series.append((sid, instance, metric, labels, canonical, source))
        return sid

    def _create_partition(self, idx: int) -> None:
        name = partition_name(idx)
        self.con.execute(f"CREATE TABLE IF NOT EXISTS {name} {PARTITION_COLUMNS}")
        self.con.execute("INSERT INTO partitions VALUES (?, ?, ?, ?, false, NULL)",
                         [idx, name, idx * HOUR_MS, (idx + 1) * HOUR_MS])
        self._partitions[idx] = False
        self._refresh_view()
