"""The DuckDB store: schema and migrations, ticks in, ingest of dumps, and every read query.

Holds: the DuckDB file: migrations, ticks in (append_many, and columns from
collectors/dump_columns.py through append_columns), closed hours as sorted zstd Parquet files beside
it (hour_archive.py), ingest of dumps, what was written since a mark (write_log.py), the stretches
the daemon evaluated its pack live (coverage_table.py), five-minute rollups of every series for long
windows (rollups.py), and every SQL query (no SQL outside this room)

Imports: collectors (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
