"""Reads of the `events` table: scrape errors and capture outcomes on each instance's timeline."""

from __future__ import annotations

from typing import Any


def last_scrape_errors(store: Any, start_ms: int, end_ms: int) -> dict[str, str]:
    """instance -> the message of its newest scrape error in (start_ms, end_ms]."""
    return dict(store.cursor().execute(
        "SELECT instance, arg_max(message, ts) FROM events WHERE kind = 'scrape_error' AND ts > ? AND ts <= ? "
        "GROUP BY 1", [start_ms, end_ms]).fetchall())


def last_capture_refusal(store: Any, instance: str | None, start_ms: int, end_ms: int) -> str | None:
    """The newest reason a py-spy capture of `instance` in [start_ms, end_ms] did not succeed, if any."""
    row = store.cursor().execute(
        "SELECT message FROM events WHERE kind = 'pyspy_capture' AND instance = ? AND ts >= ? AND ts <= ? "
        "AND coalesce(labels['status'], '') NOT IN ('ok', 'truncated') AND coalesce(message, '') <> '' "
        "ORDER BY ts DESC LIMIT 1", [instance, start_ms, end_ms]).fetchone()
    return row[0] if row else None
