"""Reads of the `series` table: the dictionary of every series the store holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import duckdb


def series_version(cur: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """(series count, highest series id): changes whenever a series is added, so a cached catalog can tell."""
    return cur.execute("SELECT count(*), coalesce(max(series_id), -1) FROM series").fetchall()[0]


def series_labels(cur: duckdb.DuckDBPyConnection, from_id: int | None = None) -> list[tuple[int, str, str, Any]]:
    """(series_id, instance, metric, labels map) of every series (with an id >= from_id when given), by id."""
    if from_id is None:
        return cur.execute("SELECT series_id, instance, metric, labels FROM series ORDER BY series_id").fetchall()
    return cur.execute("SELECT series_id, instance, metric, labels FROM series WHERE series_id >= ? "
                       "ORDER BY series_id", [from_id]).fetchall()


def metrics_present(store: Any, metrics: Iterable[str]) -> set[str]:
    """The metric names among `metrics` that have at least one series."""
    wanted = sorted(metrics)
    return {row[0] for row in store.cursor().execute(
        f"SELECT DISTINCT metric FROM series WHERE metric IN ({', '.join('?' * len(wanted))})",
        wanted).fetchall()}


def series_to_export(store: Any, instance: str | None = None) -> list[tuple[int, str, str, str, str]]:
    """(series_id, instance, metric, metric as scraped, labels_text) of every series (of `instance` when given)."""
    return store.cursor().execute(
        "SELECT series_id, instance, metric, coalesce(source_metric, metric), labels_text FROM series "
        "WHERE (? IS NULL OR instance = ?)", [instance, instance]).fetchall()


def series_count_by_instance(store: Any) -> dict[str, int]:
    """instance -> how many series it has."""
    return dict(store.cursor().execute("SELECT instance, count(*) FROM series GROUP BY 1").fetchall())


def has_gpu_series(store: Any, instance: str | None = None) -> bool:
    """True when the store holds a DCGM/NVML series (of `instance` when given)."""
    row = store.cursor().execute("SELECT count(*) FROM series WHERE metric LIKE 'DCGM_%' AND (? IS NULL OR "
                                 "instance = ?)", [instance, instance]).fetchone()
    return bool(row and row[0])
