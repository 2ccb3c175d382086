"""PromQL subset evaluated over the DuckDB store.

Holds: the PromQL subset: parser, evaluator (instant_many: one expression asked at close times
evaluated once over them), vector algebra, range functions (over long windows from the store's
rollups plus raw edges when an engine is built with rollups=True: rollup_windows.py); the series
catalog (catalog.py, one per store, shared by its engines); windows kept between the daemon's
evaluations and topped up from the store's write log (window_cache.py: range selectors and instant
lookups, staleness markers kept as Prometheus' stale NaN); window reads of a file opened read-only
kept, so a later read inside one is cut from it (read_memo.py, bounded); label-set work (grouping,
signatures, duplicate checks) remembered per key tuple (keymemo.py); matchers added to selectors
(selectors.py, scope.py); RemoteEngine (the same interface, answered by a Prometheus)

Imports: store and below (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
