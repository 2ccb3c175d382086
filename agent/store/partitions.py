"""The hourly sample partitions: their length, names, columns, and the SQL of no samples at all."""

from __future__ import annotations

HOUR_MS = 3_600_000
# a partition is "closed" (safe to sort) once its hour ended this long ago: late scrapes land first
CLOSE_GRACE_MS = 120_000
PARTITION_COLUMNS = "(ts BIGINT NOT NULL, series_id UINTEGER NOT NULL, value DOUBLE)"
EMPTY_SAMPLES = "SELECT NULL::BIGINT AS ts, NULL::UINTEGER AS series_id, NULL::DOUBLE AS value WHERE false"


def partition_name(index: int) -> str:
    """Table name of the hourly partition with this hour index since the epoch."""
    if index < 0:  # a minus sign is no part of a table name; samples before 1970 are refused earlier
        raise ValueError(f"hour index {index} is before 1970")
    return f"samples_{index}"
