"""The embedded default: a tiny model, a real vLLM CPU server, traffic, scenarios, recordings and replay.

Holds: the embedded default: tiny model, real vLLM CPU server, traffic, scenarios, recording and
replay of sessions, a real Prometheus for tests and benches, the demo's progress lines, scenario
loads sent from a child process (child_load), and trials: the what-if model's ranking checked
against real restarts (bench/whatif_restarts.py)

Imports: daemon and below (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
