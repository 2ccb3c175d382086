"""The `captures` table: py-spy stack captures and vLLM profiler traces, linked to incidents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_sentinel.collectors.base import Event

CAPTURE_COLUMNS = ("capture_id", "ts", "instance", "incident_id", "pid", "role", "kind", "status", "error",
                   "duration_ms", "samples", "folded", "idle_included", "process_state", "artifact")


def insert_captures(store: Any, rows: Sequence[dict], events: Sequence[Event]) -> int:
    """Store capture rows (dicts by column name) and their timeline events in one transaction; returns len(rows)."""
    con = store.cursor()  # appends to other tables never conflict with the writer thread's ticks
    con.execute("BEGIN TRANSACTION")
    try:
        for row in rows:
            con.execute(f"INSERT INTO captures ({', '.join(CAPTURE_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(CAPTURE_COLUMNS))})", [row[c] for c in CAPTURE_COLUMNS])
        for e in events:
            con.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", [e.ts_ms, e.instance, e.kind, e.labels, e.message])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def captures_of_kinds(store: Any, incident_id: str, kinds: Sequence[str]) -> list[tuple]:
    """(ts, kind, status, error, duration_ms, artifact) of the incident's captures of these kinds, oldest first."""
    return store.cursor().execute(
        "SELECT ts, kind, status, error, duration_ms, artifact FROM captures WHERE incident_id = ? "
        f"AND kind IN ({', '.join('?' * len(kinds))}) ORDER BY ts", [incident_id, *kinds]).fetchall()


def folded_stacks_of(store: Any, incident_id: str) -> list[tuple[int, str, str, str | None]]:
    """(pid, role, folded, process_state) of the incident's captures that hold stacks, by time, role, pid."""
    return store.cursor().execute(
        "SELECT pid, role, folded, process_state FROM captures WHERE incident_id = ? AND folded IS NOT NULL "
        "ORDER BY ts, role, pid", [incident_id]).fetchall()


def captures_around(store: Any, incident_id: str, instance: str | None, window: tuple[int, int],
                    except_kinds: Sequence[str]) -> list[dict]:
    """Captures linked to the incident, or unlinked ones of `instance` inside `window`, other than `except_kinds`;
    whole rows as dicts by column name (the table gains columns over time), by time, role, pid."""
    cur = store.cursor()
    cur.execute("SELECT * FROM captures WHERE (incident_id = ? OR (incident_id IS NULL AND instance = ? "
                f"AND ts >= ? AND ts <= ?)) AND kind NOT IN ({', '.join('?' * len(except_kinds))}) "
                "ORDER BY ts, role, pid", [incident_id, instance, *window, *except_kinds])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]
