"""Rule files, templating, alert state, rule packs, promtool-style rule tests and export.

Holds: rule files (schema, params, lint), causal links between incidents (explains.py), templating,
alert state (pending/firing/resolved as Prometheus), rule packs, promtool-format rule tests (and
episodetest.py: episode cases), export (rule files, prometheusrule.py, Grafana grafana.py), backfill
of recording rules

Imports: promql and below (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
