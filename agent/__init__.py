"""The product core: CLI, config, sidecar daemon, DuckDB store, PromQL engine, incidents, local API."""
