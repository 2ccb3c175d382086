"""One module per source of signals; each returns a Batch and never raises into the daemon.

Holds: one module per source (vLLM /metrics, fetched over a connection kept between scrapes
(scrape_http.py blocking; scrape_async.py the same contract on an asyncio loop, the daemon's), NVML,
processes and the host's sockets read once for all targets (host_sockets.py), py-spy, vLLM's
profiler, a remote Prometheus' HTTP API), the exposition parser (and dump_columns.py: a plain dump
read as columns, other lines through the parser), and the shared data model (Batch, Event, time
helpers)

Imports: nothing above (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
