"""The `incidents` table: one row per firing episode of one alert (rule + label set)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# the columns an evaluator needs to continue an episode still firing when the sidecar stopped
FIRING_COLUMNS = "rule, labels, start_ms, peak, peak_ms, last_value, annotations, evidence, fixes"
# the columns the diagnose JSON contract is built from
STORED_COLUMNS = ("id, incident, rule, severity, instance, labels, start_ms, end_ms, state, summary, peak, "
                  "evidence, fixes")
_ALL_COLUMNS = 18
_ROWS_PER_STATEMENT = 100


def firing_incident_rows(store: Any) -> list[tuple]:
    """Incidents still firing, as (FIRING_COLUMNS) tuples."""
    return store.cursor().execute(f"SELECT {FIRING_COLUMNS} FROM incidents WHERE state = 'firing'").fetchall()


def upsert_incidents(store: Any, rows: Sequence[tuple]) -> None:
    """Insert or replace incidents (full rows in the table's column order) in one transaction."""
    cur = store.cursor()
    cur.execute("BEGIN TRANSACTION")
    try:
        # one statement for all rows: executemany pays a statement's fixed cost per row
        one = f"({', '.join('?' * _ALL_COLUMNS)})"
        for i in range(0, len(rows), _ROWS_PER_STATEMENT):
            chunk = rows[i:i + _ROWS_PER_STATEMENT]
            cur.execute(f"INSERT OR REPLACE INTO incidents VALUES {', '.join([one] * len(chunk))}",
                        [v for row in chunk for v in row])
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise


def incidents_overlapping(store: Any, start_ms: int, end_ms: int, instance: str | None = None) -> list[tuple]:
    """Incidents overlapping (start_ms, end_ms] (of `instance` when given), as (STORED_COLUMNS) tuples
    ordered by start then id."""
    return store.cursor().execute(
        f"SELECT {STORED_COLUMNS} FROM incidents WHERE start_ms <= ? AND (end_ms IS NULL OR end_ms > ?) "
        "AND (? IS NULL OR instance = ?) ORDER BY start_ms, id", [end_ms, start_ms, instance, instance]).fetchall()


def incidents_by_id_prefix(store: Any, id_or_prefix: str, limit: int = 5) -> list[tuple[str, int]]:
    """(id, start_ms) of the incidents whose id is, or starts with, `id_or_prefix`; at most `limit`, by id."""
    return store.cursor().execute(
        "SELECT id, start_ms FROM incidents WHERE id = ? OR starts_with(id, ?) ORDER BY id LIMIT ?",
        [id_or_prefix, id_or_prefix, limit]).fetchall()
