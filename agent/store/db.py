"""The DuckDB store: a series dictionary plus narrow samples in hourly partitions.

One process (the daemon, or `ingest`) opens the file read-write; DuckDB locks every other
process out, readers included, so readers go through the daemon's local API and open the
file read-only only when no daemon holds it.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

import duckdb
import numpy as np

from vllm_sentinel.agent.store import coverage_table, hour_archive, rollups
from vllm_sentinel.agent.store.migrations import MIGRATIONS, migrate, schema_version
from vllm_sentinel.agent.store.sample_checks import (MAX_TS_MS, MIN_TS_MS, Refusals, Rejected, describe_labels,
                                                     describe_timestamp, timestamp_ok)
from vllm_sentinel.agent.store.write_log import EVERYTHING, WriteLog
from vllm_sentinel.collectors.base import Batch, Event, format_labels
from vllm_sentinel.collectors.exposition import parse_labels

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
# a partition is "closed" (safe to sort) once its hour ended this long ago: late scrapes land first
CLOSE_GRACE_MS = 120_000
# DuckDB's buffer pool for a read-write store: without a limit it keeps every block it wrote (80 % of RAM),
# so the daemon's memory grows with the hour; past the limit it evicts, and large sorts spill to disk
DEFAULT_MEMORY_LIMIT = "256MB"
_LAYOUTS_MAX = 10_000  # batch layouts kept (one per target and collector); cleared when more appear
PARTITION_COLUMNS = "(ts BIGINT NOT NULL, series_id UINTEGER NOT NULL, value DOUBLE)"
# tests only: stop at this named point inside a transaction so a test can kill -9 the process there
_STALL_AT = os.environ.get("VLLM_SENTINEL_TEST_STALL_AT")

class StoreError(Exception):
    """A store problem an operator can act on; the message names the fix."""


class StoreLocked(StoreError):
    """Another process holds the DuckDB file."""


class StoreCorrupt(StoreError):
    """The file is not a readable DuckDB database."""


class SchemaMissing(StoreError):
    """A read-only open found no (or an older) vllm-sentinel schema."""


class StoreUnwritable(StoreError):
    """The file cannot be written (disk full, I/O error): nothing of that commit was stored."""


class SamplesRejected(StoreError):
    """Samples the store cannot hold (time outside 1970..2262, broken labels); nothing of that call was stored."""

    def __init__(self, rejected: list[Rejected]):
        self.rejected = rejected
        total = sum(r.count for r in rejected)
        super().__init__(f"{total} sample(s) refused and nothing of them stored: {rejected[0].message}")


def partition_name(index: int) -> str:
    """Table name of the hourly partition with this hour index since the epoch."""
    if index < 0:  # a minus sign is no part of a table name; samples before 1970 are refused earlier
        raise ValueError(f"hour index {index} is before 1970")
    return f"samples_{index}"


def _stall(point: str) -> None:
    if _STALL_AT == point:
        sys.stderr.write(f"stalled at {point}\n")
        sys.stderr.flush()
        threading.Event().wait()


def _unwritable(e: Exception) -> bool:
    """True for a failure of the file, not of the data: the same commit would succeed once space returns."""
    msg = str(e)
    return isinstance(e, duckdb.IOException) or any(
        s in msg for s in ("No space left", "Could not write", "Failed to commit", "Disk quota"))


# DuckDB's words when the commit reached the WAL and only the checkpoint after it failed
_COMMITTED_ANYWAY = "COMMIT succeeded and is durable"


def _invalidating(e: Exception) -> bool:
    """True when DuckDB has invalidated the database instance: nothing more works until it is reopened."""
    return isinstance(e, duckdb.FatalException) or "database has been invalidated" in str(e)


def _open_connection(path: str, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(path, read_only=read_only)
    except duckdb.IOException as e:
        msg = str(e)
        if "lock" in msg.lower():
            pid = re.search(r"PID (\d+)", msg)
            holder = f" (PID {pid.group(1)})" if pid else ""
            raise StoreLocked(
                f"{path} is held by another process{holder}. If it is the vllm-sentinel daemon, "
                "ask it through its API (it is used automatically when its socket exists); "
                "otherwise stop that process or copy nothing from a live file."
            ) from e
        if not read_only and not Path(path).exists():
            raise StoreError(f"cannot create {path}: {msg}. Check the directory exists and is writable.") from e
        raise StoreCorrupt(
            f"{path} could not be opened as a DuckDB database ({msg.splitlines()[0]}). "
            "Move the file aside and start with a new --db; vllm-sentinel never overwrites it."
        ) from e
    except (duckdb.Error, RuntimeError) as e:
        raise StoreCorrupt(
            f"{path} could not be opened as a DuckDB database ({str(e).splitlines()[0]}). "
            "Move the file aside and start with a new --db; vllm-sentinel never overwrites it."
        ) from e


class Store:
    """Series dictionary + hourly sample partitions in one DuckDB file."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str, read_only: bool):
        self.con = con
        self.path = path
        self.read_only = read_only
        # a file opened read-only: DuckDB's lock keeps every writer out while it is open, so its series never
        # change (a reader() view of a writable store is read-only but not fixed: its writer goes on adding)
        self.series_fixed = read_only
        self._lock = threading.RLock()
        self._series: dict[tuple[str, str, str], int] = {}  # (instance, metric, label text as seen)
        # (instance, samples, first and last metric) -> (metrics, label texts, series ids) of its last batch
        self._layouts: dict[tuple, tuple[list[str], list[str], list[int]]] = {}
        self._canonical: dict[tuple[str, str, str], int] = {}  # (instance, metric, canonical text)
        self._next_id = 0
        self._partitions: dict[int, bool] = {}  # hour index -> sorted (its table empty, all of it in its archive)
        self._archives: dict[int, str] = {}  # hour index -> its Parquet file's name in self.archive_folder
        self.archive_folder = hour_archive.folder_for(path)
        self.missing_archives: list[str] = []  # archive files a partition names but the folder lacks
        self._invalidated: str | None = None  # why DuckDB invalidated the connection; reopened before the next write
        self.writes = WriteLog()  # what changed since a live reader's last read
        self._rolled_until = 0  # rollups.rolled_until, kept here so a write checks it without a query
        self._load()

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, read_only: bool = False,
             memory_limit: str | None = DEFAULT_MEMORY_LIMIT, threads: int | None = None) -> "Store":
        """Open (and create or migrate, when read-write) the store at `path`; a read-write open bounds
        DuckDB's memory to `memory_limit` (None: DuckDB's default, 80 % of RAM); `threads` bounds DuckDB's
        worker and I/O threads (None: DuckDB's defaults, which grow with the cores)."""
        path = str(path)
        memory = _memory_setting(memory_limit) if memory_limit and not read_only else None  # before any file is made
        if path != ":memory:" and not read_only:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        if read_only and path != ":memory:" and not Path(path).exists():
            raise StoreError(f"{path} does not exist. Run `vllm-sentinel run` or `ingest` with this --db first.")
        con = _open_connection(path, read_only)
        try:
            if read_only:
                _check_schema(con, path)
            else:
                migrate(con)
                if memory:
                    con.execute(f"SET memory_limit = '{memory}'")
            if threads:
                # async_threads too: DuckDB starts 4 per core for I/O tasks (64 on a 16-core GPU host, 8 here),
                # which the daemon's single-file store does not use
                con.execute(f"SET threads = {int(threads)}")
                con.execute(f"SET async_threads = {int(threads)}")
            store = cls(con, path, read_only)
            if not read_only:
                hour_archive.sweep(store.archive_folder, set(store._archives.values()))
                if store.missing_archives:
                    store._refresh_view()  # the ad-hoc view stops naming files that are gone
            return store
        except duckdb.Error as e:
            con.close()
            raise StoreCorrupt(f"{path}: {str(e).splitlines()[0]}. Move the file aside and use a new --db.") from e

    def close(self) -> None:
        """Commit nothing pending (every append is its own transaction) and release the file."""
        with self._lock:
            self.con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for reads from another thread (DuckDB connections are not shared across threads)."""
        return self.con.cursor()

    def reader(self) -> "Store":
        """A read-only view for another thread: same partitions, its own cursor (a consistent snapshot)."""
        view = object.__new__(Store)
        view.__dict__.update(self.__dict__)
        view.con = self.con.cursor()
        view.read_only = True
        view._partitions = dict(self._partitions)
        view._archives = dict(self._archives)
        return view

    def _load(self) -> None:
        self._rolled_until = rollups.rolled_until(self.con)
        rows = self.con.execute("SELECT series_id, instance, metric, labels_text FROM series").fetchall()
        for sid, instance, metric, text in rows:
            self._canonical[(instance, metric, text)] = sid
            self._series[(instance, metric, text)] = sid
        self._next_id = max((r[0] for r in rows), default=-1) + 1
        self.missing_archives = []
        for idx, is_sorted, archive in self.con.execute("SELECT idx, sorted, archive FROM partitions").fetchall():
            self._partitions[idx] = bool(is_sorted)
            if archive is None:
                continue
            if self.archive_folder is not None and (self.archive_folder / archive).is_file():
                self._archives[idx] = archive
            else:
                # reads go on without that hour rather than failing every query that touches it
                self.missing_archives.append(archive)
                log.warning("%s: the archive file %s of hour %d is missing; its samples cannot be read. Restore "
                            "it into %s", self.path, archive, idx, self.archive_folder)

    # -- writing -----------------------------------------------------------------------------
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
        frames = _samples_frames(ts_col, sid_col, val_col)
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
                con.register("_new_series", _series_frame(new_series))
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
            _stall("append:before_commit")
            con.execute("COMMIT")
            if rolled is not None:
                self._rolled_until = rolled
        except duckdb.Error as e:
            if _invalidating(e):
                # DuckDB stops serving this connection after a fatal error, so reopen before the next write
                self._invalidated = str(e).splitlines()[0][:200]
                if _COMMITTED_ANYWAY in str(e):
                    if rolled is not None:
                        self._rolled_until = rolled
                    return hours  # only the checkpoint after the commit failed: the tick is in the WAL, stored
            if _unwritable(e) or self._invalidated:
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
            con = _open_connection(self.path, read_only=False)
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

    def _rollback(self) -> None:
        """ROLLBACK when a transaction is open; a failed COMMIT (disk full) has already ended it."""
        try:
            self.con.execute("ROLLBACK")
        except duckdb.TransactionException:
            pass  # "no transaction is active": nothing to undo
        except duckdb.Error:
            pass  # the connection itself failed; the caller's error says why

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

    def _refresh_view(self) -> None:
        # `samples` spans every partition, for ad-hoc SQL; the engine uses samples_sql() instead
        parts = [self._partition_sql(i) for i in sorted(self._partitions)]
        body = " UNION ALL ".join(parts) if parts else _EMPTY_SAMPLES
        self.con.execute(f"CREATE OR REPLACE VIEW samples AS {body}")

    def _partition_sql(self, idx: int) -> str:
        """One hour's rows: its table (the samples not yet archived) and its archive file, if any."""
        table = f"SELECT ts, series_id, value FROM {partition_name(idx)}"
        archive = self._archives.get(idx)
        if archive is None or self.archive_folder is None:
            return table
        return f"{table} UNION ALL {hour_archive.read_sql(self.archive_folder / archive)}"

    # -- maintenance -------------------------------------------------------------------------
    def drop_before(self, cutoff_ms: int) -> list[str]:
        """Retention: drop whole partitions (table and archive file) whose hour ended at or before `cutoff_ms`."""
        dropped = []
        with self._lock:
            old = [i for i in sorted(self._partitions) if (i + 1) * HOUR_MS <= cutoff_ms]
            if not old:
                return dropped
            saved, saved_archives = self._partitions, self._archives
            self.con.execute("BEGIN TRANSACTION")
            try:
                for idx in old:
                    self.con.execute(f"DROP TABLE {partition_name(idx)}")
                    self.con.execute("DELETE FROM partitions WHERE idx = ?", [idx])
                    dropped.append(partition_name(idx))
                self._partitions = {i: s for i, s in saved.items() if i not in old}
                self._archives = {i: a for i, a in saved_archives.items() if i not in old}
                self._refresh_view()
                self.con.execute("DELETE FROM events WHERE ts < ?", [cutoff_ms])
                coverage_table.drop_before(self.con, cutoff_ms)
                rollups.drop_before(self.con, cutoff_ms)
                _stall("retention:before_commit")
                self.con.execute("COMMIT")
            except BaseException:
                self._partitions, self._archives = saved, saved_archives
                self._rollback()
                raise
            # files go only once no partition names them; a kill before this leaves them to the next open's sweep
            _stall("retention:before_unlink")
            hour_archive.remove(self.archive_folder, [saved_archives[i] for i in old if i in saved_archives])
            self.writes.note(EVERYTHING)
        return dropped

    def sort_closed(self, now_ms: int) -> list[str]:
        """Rewrite partitions whose hour has closed sorted by (series_id, ts): a zstd Parquet file beside the
        store (an in-memory store sorts the table in place). Returns the partitions rewritten."""
        done = []
        with self._lock:
            for idx, is_sorted in sorted(self._partitions.items()):
                if is_sorted or (idx + 1) * HOUR_MS + CLOSE_GRACE_MS > now_ms:
                    continue
                if self.archive_folder is None:
                    self._sort_in_place(idx)
                else:
                    self._archive(idx)
                self._partitions[idx] = True
                done.append(partition_name(idx))
            if done:
                self.writes.note(EVERYTHING)  # same rows, another place: readers start over
                _stall("rewrite:before_checkpoint")
                self.con.execute("CHECKPOINT")
        return done

    def _archive(self, idx: int) -> None:
        """Hour `idx` (its table plus any earlier archive) to a new sorted Parquet file; its table emptied."""
        assert self.archive_folder is not None
        name = partition_name(idx)
        previous = self._archives.get(idx)
        rows = [f"SELECT ts, series_id, value FROM {name}"]
        if previous is not None:
            rows.append(hour_archive.read_sql(self.archive_folder / previous))
        fresh = hour_archive.new_name(idx)
        # DuckDB sorts within its memory limit, spilling to disk, and streams the file out
        hour_archive.write(self.con, f"SELECT * FROM ({' UNION ALL '.join(rows)}) ORDER BY series_id, ts",
                           self.archive_folder, fresh)
        _stall("rewrite:sorted_copy")
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DROP VIEW IF EXISTS samples")
            self.con.execute(f"DROP TABLE {name}")  # dropped, not deleted from: its blocks are freed at checkpoint
            self.con.execute(f"CREATE TABLE {name} {PARTITION_COLUMNS}")
            self.con.execute("UPDATE partitions SET sorted = true, archive = ? WHERE idx = ?", [fresh, idx])
            self._archives[idx] = fresh
            self._refresh_view()
            _stall("rewrite:before_commit")
            self.con.execute("COMMIT")
        except BaseException:
            if previous is None:
                self._archives.pop(idx, None)
            else:
                self._archives[idx] = previous
            self._rollback()
            hour_archive.remove(self.archive_folder, [fresh])
            raise
        if previous is not None:
            hour_archive.remove(self.archive_folder, [previous])

    def roll_up(self, now_ms: int, max_blocks: int = rollups.BLOCKS_PER_ROUND) -> int:
        """Roll the five-minute blocks that ended ROLL_DELAY_MS before now_ms (at most max_blocks of them)."""
        return rollups.roll_up(self, now_ms - rollups.ROLL_DELAY_MS, max_blocks)

    def _sort_in_place(self, idx: int) -> None:
        """An in-memory store's closed hour, rewritten as a table sorted by (series_id, ts)."""
        name = partition_name(idx)
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute(f"CREATE TABLE {name}_sorting AS SELECT * FROM {name} ORDER BY series_id, ts")
            self.con.execute("DROP VIEW IF EXISTS samples")
            self.con.execute(f"DROP TABLE {name}")
            self.con.execute(f"ALTER TABLE {name}_sorting RENAME TO {name}")
            self.con.execute("UPDATE partitions SET sorted = true WHERE idx = ?", [idx])
            self._refresh_view()
            self.con.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    # -- reading -----------------------------------------------------------------------------
    @property
    def series_count(self) -> int:
        """Series known to this store (ids are dense from 0)."""
        return self._next_id

    def partitions(self) -> list[tuple[int, bool]]:
        """(hour index, sorted) of every partition, oldest first."""
        return sorted(self._partitions.items())

    def samples_sql(self, start_ms: int, end_ms: int) -> str:
        """SQL subquery over the partitions overlapping [start_ms, end_ms]; callers still filter ts."""
        idx = [i for i in sorted(self._partitions) if (i + 1) * HOUR_MS > start_ms and i * HOUR_MS <= end_ms]
        if not idx:
            return f"({_EMPTY_SAMPLES})"
        return "(" + " UNION ALL ".join(self._partition_sql(i) for i in idx) + ")"

    def time_range(self) -> tuple[int, int] | None:
        """Oldest and newest sample time in the store, or None when empty."""
        # the oldest and the newest partition that hold a sample answer it: a day of them is not scanned
        cur = self.cursor()
        ends = []
        for order, agg in ((sorted(self._partitions), "min"), (sorted(self._partitions, reverse=True), "max")):
            for idx in order:
                value = cur.execute(f"SELECT {agg}(ts) FROM ({self._partition_sql(idx)})").fetchall()[0][0]
                if value is not None:
                    ends.append(int(value))
                    break
        return (ends[0], ends[1]) if len(ends) == 2 else None


_EMPTY_SAMPLES = "SELECT NULL::BIGINT AS ts, NULL::UINTEGER AS series_id, NULL::DOUBLE AS value WHERE false"


def _memory_setting(limit: str) -> str:
    """A DuckDB memory size such as 256MB or 1GiB; anything else is refused (it is put into SQL)."""
    if not re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)", limit.strip(), re.IGNORECASE):
        raise StoreError(f"store memory limit {limit!r} (--store-memory) is not a size such as 256MB or 1GiB")
    return limit.strip()


def _objects(items: list) -> np.ndarray:
    """A 1-d object array of `items` as they are (np.array would make a list of lists two-dimensional)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _series_frame(rows: list[tuple[int, str, str, dict[str, str], str, str]]) -> dict[str, np.ndarray]:
    """New series as numpy columns DuckDB scans (labels as key and value lists, made a MAP in SQL).

    Numpy, not Arrow: the daemon then never loads pyarrow (about 30 MiB of its RSS)."""
    return {
        "series_id": np.fromiter((r[0] for r in rows), np.uint32, len(rows)),
        "instance": _objects([r[1] for r in rows]),
        "metric": _objects([r[2] for r in rows]),
        "label_keys": _objects([list(r[3]) for r in rows]),
        "label_values": _objects([list(r[3].values()) for r in rows]),
        "labels_text": _objects([r[4] for r in rows]),
        "source_metric": _objects([r[5] for r in rows]),
    }


_NAN_SQL = "'NaN'::DOUBLE"


def _samples_frames(ts_col: list[int] | np.ndarray, sid_col: list[int] | np.ndarray,
                    val_col: list[float | None] | np.ndarray) -> list[tuple[dict[str, np.ndarray], str]]:
    """The samples as numpy columns DuckDB scans, each frame with the SQL of its value column.

    DuckDB reads a NaN in a numpy column as NULL, and numpy makes None a NaN. So the samples whose value is
    NaN are looked at again (rare: a NaN gauge, or a staleness marker, a None stored as NULL) and go apart
    in frames of their own, whose value the INSERT writes as a constant."""
    ts = np.asarray(ts_col, dtype=np.int64)
    sids = np.asarray(sid_col, dtype=np.uint32)
    values = np.asarray(val_col, dtype=np.float64)
    nan_at = np.flatnonzero(np.isnan(values))
    if not len(nan_at):
        return [({"ts": ts, "series_id": sids, "value": values}, "value")]
    if isinstance(val_col, np.ndarray):
        stale = np.zeros(len(nan_at), dtype=bool)
    else:
        stale = np.fromiter((val_col[i] is None for i in nan_at), bool, len(nan_at))
    keep = np.ones(len(values), dtype=bool)
    keep[nan_at] = False
    frames = [({"ts": ts[keep], "series_id": sids[keep], "value": values[keep]}, "value")]
    for rows, value_sql in ((nan_at[~stale], _NAN_SQL), (nan_at[stale], "NULL")):
        if len(rows):
            frames.append(({"ts": ts[rows], "series_id": sids[rows]}, value_sql))
    return frames


def table_exists(store: Store, name: str) -> bool:
    """True when the store has a table (or view) of this name."""
    row = store.cursor().execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()
    return bool(row and row[0])


def _check_schema(con: duckdb.DuckDBPyConnection, path: str) -> None:
    have, want = schema_version(con), MIGRATIONS[-1][0]
    if have == 0:
        con.close()
        raise SchemaMissing(f"{path} is not a vllm-sentinel database (no schema). Point --db at the file "
                            "the daemon or `ingest` writes.")
    if have < want:
        con.close()
        raise SchemaMissing(f"{path} has schema version {have}, this vllm-sentinel needs {want}. Open it once "
                            "read-write (start the daemon, or `vllm-sentinel ingest`) to migrate it.")
