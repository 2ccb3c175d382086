"""The DuckDB store: schema and migrations, ticks in, ingest of dumps, and every read query."""
