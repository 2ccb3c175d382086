"""The `config_snapshots` table: each vLLM instance's live configuration, one row per change.

A row is in force from its `ts` until the next row of the same instance; `config` and `sources`
are JSON text (LiveConfig.to_json), returned here as stored.
"""

from __future__ import annotations

from typing import Any

# (ts ms, config JSON, sources JSON)
SnapshotRow = tuple[int, str, str]


def config_snapshot_at(store: Any, instance: str, t_ms: int) -> SnapshotRow | None:
    """The snapshot in force at `t_ms`: the newest one at or before it, or None."""
    return store.cursor().execute(
        "SELECT ts, config, sources FROM config_snapshots WHERE instance = ? AND ts <= ? ORDER BY ts DESC LIMIT 1",
        [instance, t_ms]).fetchone()


def first_config_snapshot(store: Any, instance: str) -> SnapshotRow | None:
    """The oldest snapshot of `instance`, or None."""
    return store.cursor().execute(
        "SELECT ts, config, sources FROM config_snapshots WHERE instance = ? ORDER BY ts LIMIT 1",
        [instance]).fetchone()


def config_snapshots_after(store: Any, instance: str, start_ms: int, end_ms: int) -> list[SnapshotRow]:
    """Snapshots taken in (start_ms, end_ms], oldest first."""
    return store.cursor().execute(
        "SELECT ts, config, sources FROM config_snapshots WHERE instance = ? AND ts > ? AND ts <= ? ORDER BY ts",
        [instance, start_ms, end_ms]).fetchall()


def insert_config_snapshot(store: Any, instance: str, ts_ms: int, config: str, sources: str) -> None:
    """Record a configuration as in force from `ts_ms`."""
    store.cursor().execute("INSERT INTO config_snapshots VALUES (?, ?, ?, ?)", [ts_ms, instance, config, sources])
