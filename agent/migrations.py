"""Schema migrations, applied in order and recorded in `schema_migrations`; never edit a released one."""

from __future__ import annotations

# (version, description, statements); append new versions, never rewrite old ones
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "series dictionary, hourly sample partitions, events", [
        """CREATE TABLE IF NOT EXISTS schema_migrations (
               version INTEGER PRIMARY KEY, description VARCHAR, applied_at TIMESTAMP)""",
        """CREATE TABLE series (
               series_id UINTEGER PRIMARY KEY,
               instance VARCHAR NOT NULL,
               metric VARCHAR NOT NULL,
               labels MAP(VARCHAR, VARCHAR) NOT NULL,
               labels_text VARCHAR NOT NULL,
               source_metric VARCHAR NOT NULL)""",
        """CREATE TABLE partitions (
               idx BIGINT PRIMARY KEY, name VARCHAR NOT NULL,
               start_ms BIGINT NOT NULL, end_ms BIGINT NOT NULL, sorted BOOLEAN NOT NULL)""",
        """CREATE TABLE events (
               ts BIGINT NOT NULL, instance VARCHAR NOT NULL, kind VARCHAR NOT NULL,
               labels MAP(VARCHAR, VARCHAR), message VARCHAR)""",
        "CREATE VIEW samples AS SELECT NULL::BIGINT AS ts, NULL::UINTEGER AS series_id, "
        "NULL::DOUBLE AS value WHERE false",
    ]),
]
