"""The DuckDB store: a series dictionary plus narrow samples in hourly partitions.

One process (the daemon, or `ingest`) opens the file read-write; DuckDB locks every other
process out, readers included, so readers go through the daemon's local API and open the
file read-only only when no daemon holds it.

This module opens the file and holds the Store; its writes are in tick_writes.py, its upkeep
of hours (retention, sorting, rollups) in hour_rewrites.py, its reads in partition_reads.py.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import duckdb

from vllm_sentinel.agent.store import hour_archive, rollups
from vllm_sentinel.agent.store.connection import check_schema, memory_setting, open_connection
from vllm_sentinel.agent.store.hour_rewrites import HourRewrites
from vllm_sentinel.agent.store.migrations import migrate
from vllm_sentinel.agent.store.partition_reads import PartitionReads
from vllm_sentinel.agent.store.store_errors import StoreCorrupt, StoreError
from vllm_sentinel.agent.store.tick_writes import TickWrites
from vllm_sentinel.agent.store.write_log import WriteLog
# imported from here by the rest of the project and its tests
from vllm_sentinel.agent.store.partitions import HOUR_MS  # noqa: F401
from vllm_sentinel.agent.store.store_errors import (SamplesRejected, SchemaMissing, StoreLocked,  # noqa: F401
                                                    StoreUnwritable)

log = logging.getLogger(__name__)

# DuckDB's buffer pool for a read-write store: without a limit it keeps every block it wrote (80 % of RAM),
# so the daemon's memory grows with the hour; past the limit it evicts, and large sorts spill to disk
DEFAULT_MEMORY_LIMIT = "256MB"


class Store(TickWrites, HourRewrites, PartitionReads):
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
        memory = memory_setting(memory_limit) if memory_limit and not read_only else None  # before any file is made
        if path != ":memory:" and not read_only:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        if read_only and path != ":memory:" and not Path(path).exists():
            raise StoreError(f"{path} does not exist. Run `vllm-sentinel run` or `ingest` with this --db first.")
        con = open_connection(path, read_only)
        try:
            if read_only:
                check_schema(con, path)
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

    def _rollback(self) -> None:
        """ROLLBACK when a transaction is open; a failed COMMIT (disk full) has already ended it."""
        try:
            self.con.execute("ROLLBACK")
        except duckdb.TransactionException:
            pass  # "no transaction is active": nothing to undo
        except duckdb.Error:
            pass  # the connection itself failed; the caller's error says why


def table_exists(store: Store, name: str) -> bool:
    """True when the store has a table (or view) of this name."""
    row = store.cursor().execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()
    return bool(row and row[0])
