"""PromQL subset evaluated over the DuckDB store."""
