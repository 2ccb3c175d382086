"""The Store's upkeep of its hours: retention, closed hours rewritten sorted (to Parquet), rollups rolled."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import duckdb

from vllm_sentinel.agent.store import coverage_table, hour_archive, rollups
from vllm_sentinel.agent.store.crash_points import stall
from vllm_sentinel.agent.store.partitions import CLOSE_GRACE_MS, HOUR_MS, PARTITION_COLUMNS, partition_name
from vllm_sentinel.agent.store.write_log import EVERYTHING, WriteLog


class HourRewrites:
    """Store's maintenance side (a mixin of db.Store, whose __init__ sets the fields below)."""

    con: duckdb.DuckDBPyConnection
    archive_folder: Path | None
    writes: WriteLog
    _lock: threading.RLock
    _partitions: dict[int, bool]
    _archives: dict[int, str]
    # db.Store's and PartitionReads'
    _rollback: Callable[[], None]
    _refresh_view: Callable[[], None]

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
                stall("retention:before_commit")
                self.con.execute("COMMIT")
            except BaseException:
                self._partitions, self._archives = saved, saved_archives
                self._rollback()
                raise
            # files go only once no partition names them; a kill before this leaves them to the next open's sweep
            stall("retention:before_unlink")
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
                stall("rewrite:before_checkpoint")
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
        stall("rewrite:sorted_copy")
        self.con.execute("BEGIN TRANSACTION")
        try:
            self.con.execute("DROP VIEW IF EXISTS samples")
            self.con.execute(f"DROP TABLE {name}")  # dropped, not deleted from: its blocks are freed at checkpoint
            self.con.execute(f"CREATE TABLE {name} {PARTITION_COLUMNS}")
            self.con.execute("UPDATE partitions SET sorted = true, archive = ? WHERE idx = ?", [fresh, idx])
            self._archives[idx] = fresh
            self._refresh_view()
            stall("rewrite:before_commit")
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
