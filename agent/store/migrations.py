"""Schema migrations, applied in order and recorded in `schema_migrations`; never edit a released one."""

from __future__ import annotations

import duckdb

from vllm_sentinel.agent.store.rollups import TABLES as ROLLUP_TABLES

# One row per process captured (Capture.to_row in collectors/pyspy.py, ProfileCapture.to_row in
# collectors/profiler.py). Columns: ts in ms since the epoch when the capture started; incident_id NULL for
# an on-demand capture; role api_server | engine_core | worker | dp_coordinator; kind dump | record |
# torch_profile | ...; status ok | truncated | py_spy_missing | permission_denied | process_exited | ...;
# folded holds folded stacks, 'root;...;leaf count' per line; idle_included false when only running
# threads were sampled (a record without --idle); process_state the /proc state letter at capture start
# ('T' = stopped); artifact where an external trace went (the torch profiler's directory), else NULL.
CAPTURES_TABLE = """CREATE TABLE captures (
               capture_id VARCHAR PRIMARY KEY, ts BIGINT NOT NULL, instance VARCHAR NOT NULL,
               incident_id VARCHAR, pid INTEGER NOT NULL, role VARCHAR NOT NULL, kind VARCHAR NOT NULL,
               status VARCHAR NOT NULL, error VARCHAR, duration_ms BIGINT, samples BIGINT, folded VARCHAR,
               idle_included BOOLEAN, process_state VARCHAR, artifact VARCHAR)"""

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
    (2, "incidents raised by alerting rules (agent/diagnosis/incidents.py)", [
        # one row per firing episode of one alert (rule + label set); times in ms since the epoch
        """CREATE TABLE incidents (
               id VARCHAR PRIMARY KEY,
               incident VARCHAR NOT NULL,
               rule VARCHAR NOT NULL,
               severity VARCHAR,
               instance VARCHAR,
               labels MAP(VARCHAR, VARCHAR) NOT NULL,
               label_key VARCHAR NOT NULL,
               start_ms BIGINT NOT NULL,
               end_ms BIGINT,
               state VARCHAR NOT NULL,
               peak DOUBLE,
               peak_ms BIGINT,
               last_value DOUBLE,
               summary VARCHAR,
               annotations VARCHAR,
               evidence VARCHAR,
               fixes VARCHAR,
               updated_ms BIGINT NOT NULL)""",
        "CREATE INDEX incidents_start ON incidents (start_ms)",
    ]),
    (3, "live configuration snapshots of each vLLM instance (agent/diagnosis/liveconfig.py)", [
        # one row per change: the configuration in force from ts until the next row of that instance;
        # config holds the values, sources where each came from (flag, cache_config_info, model config, default)
        """CREATE TABLE config_snapshots (
               ts BIGINT NOT NULL,
               instance VARCHAR NOT NULL,
               config JSON NOT NULL,
               sources JSON NOT NULL)""",
        "CREATE INDEX config_snapshots_instance_ts ON config_snapshots (instance, ts)",
    ]),
    (4, "py-spy stack captures, linked to incidents (collectors/pyspy.py Capture.to_row)", [
        CAPTURES_TABLE,
        "CREATE INDEX captures_incident ON captures (incident_id)",
    ]),
    (5, "closed hours archived as sorted Parquet files beside the store (agent/store/hour_archive.py)", [
        # the file's name inside <store>.hours/; NULL while the hour lives only in its table
        "ALTER TABLE partitions ADD COLUMN archive VARCHAR",
    ]),
    (6, "stretches of time the daemon evaluated a rule pack live (agent/store/coverage_table.py)", [
        # pack: the rule pack's fingerprint; the daemon evaluated it at start_ms, at end_ms and at most
        # a few seconds apart in between, so its incidents for that stretch are in the incidents table
        """CREATE TABLE rule_coverage (
               pack VARCHAR NOT NULL,
               start_ms BIGINT NOT NULL,
               end_ms BIGINT NOT NULL)""",
    ]),
    (7, "five-minute rollups of every series for long windows (agent/store/rollups.py)", ROLLUP_TABLES),
]


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The highest migration applied to this database (0 for a new file)."""
    has = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'").fetchone()[0]
    if not has:
        return 0
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0]


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Apply pending migrations, each in its own transaction and recorded; returns the new version."""
    current = schema_version(con)
    for version, description, statements in MIGRATIONS:
        if version <= current:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            for sql in statements:
                con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now())", [version, description])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        current = version
    return current
