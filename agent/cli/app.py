"""The `vllm-sentinel` command line: the typer app, every command module mounted on it, and main()."""

from __future__ import annotations

import typer

from vllm_sentinel.agent.cli import (capacity, capture, compare, demo, diagnose, export, ingest, plan, report, rules,
                                    run, status)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Observability and incident diagnosis for vLLM: metrics, GPU counters and stacks on one timeline.")

# one module per command (each a thin typer app of one command), listed in --help in this order
for _module in (run, diagnose, compare, capacity, ingest, status, capture, demo, plan, report):
    app.registered_commands.extend(_module.app.registered_commands)
app.add_typer(rules.app, name="rules")
app.add_typer(export.app, name="export")


def main() -> None:
    """Console-script entry point."""
    app()
