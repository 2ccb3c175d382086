"""The `vllm-sentinel` command line: one module per command group over the library.

Holds: the typer app (app.py: a command's module is imported only when that command runs): one
module per command group, shared options and errors, the one "ask the daemon, else open the file
read-only" path, run --config files (run_config.py)

Imports: everything below (the layers contract in pyproject.toml; scripts/lint_layers.sh).
"""
