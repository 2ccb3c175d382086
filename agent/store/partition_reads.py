"""The Store's reads over its hourly partitions: SQL over an interval's hours, the `samples` view, the time range."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb

from vllm_sentinel.agent.store import hour_archive
from vllm_sentinel.agent.store.partitions import EMPTY_SAMPLES, HOUR_MS, partition_name


class PartitionReads:
    """Store's read side over its partitions (a mixin of db.Store, whose __init__ sets the fields below)."""

    con: duckdb.DuckDBPyConnection
    archive_folder: Path | None
    _partitions: dict[int, bool]
    _archives: dict[int, str]
    _next_id: int
    cursor: Callable[[], duckdb.DuckDBPyConnection]  # db.Store's

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
            return f"({EMPTY_SAMPLES})"
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

    def _refresh_view(self) -> None:
        # `samples` spans every partition, for ad-hoc SQL; the engine uses samples_sql() instead
        parts = [self._partition_sql(i) for i in sorted(self._partitions)]
        body = " UNION ALL ".join(parts) if parts else EMPTY_SAMPLES
        self.con.execute(f"CREATE OR REPLACE VIEW samples AS {body}")

    def _partition_sql(self, idx: int) -> str:
        """One hour's rows: its table (the samples not yet archived) and its archive file, if any."""
        table = f"SELECT ts, series_id, value FROM {partition_name(idx)}"
        archive = self._archives.get(idx)
        if archive is None or self.archive_folder is None:
            return table
        return f"{table} UNION ALL {hour_archive.read_sql(self.archive_folder / archive)}"
