"""Markdown/JSON rendering and charts.

Holds: a report model, assembly from store queries (or a Prometheus: assemble_remote.py), Markdown,
console tables, charts (drawn in a short-lived child process for the daemon, chart_process.py, so
matplotlib never loads into it)

Imports: diagnosis and below (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
