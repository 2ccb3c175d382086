"""The `vllm-sentinel` command line: the typer app, every command module mounted on it, and main().

A command's module is imported when that command runs, not before: `diagnose` does not pay for
the daemon, the demo and the capacity search (importing every command cost 0.8 s of a 1.9 s
`diagnose --since 1h`). `--help` imports them all to list them.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING

import typer
import typer.core
import typer.main

if TYPE_CHECKING:  # typer 0.29 carries its own click (typer._click) and no longer installs click
    import click

# command -> its module in agent/cli (each a thin typer app of one command), in the order --help lists them
COMMANDS = {"run": "run", "diagnose": "diagnose", "compare": "compare", "whatif": "whatif", "capacity": "capacity",
            "ingest": "ingest", "status": "status", "capture": "capture", "demo": "demo", "plan": "plan", "report": "report",
            "rules": "rules", "export": "export"}
GROUPS = {"rules", "export"}  # these modules' apps are groups of subcommands (export has one so far)


# set before a command's module imports NumPy. The daemon does no linear algebra, and OpenBLAS starts one
# thread per core when NumPy loads: 15 idle threads on a 16-core GPU host, next to the vLLM they watch.
COMMAND_ENVIRONMENT = {"run": {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}}


def load_command(name: str) -> click.Command:
    """The click command `name`, its module imported now."""
    if "numpy" not in sys.modules:  # too late once it is loaded (`--help` of every command, tests)
        for key, value in COMMAND_ENVIRONMENT.get(name, {}).items():
            os.environ.setdefault(key, value)
    module = importlib.import_module(f"vllm_sentinel.agent.cli.{COMMANDS[name]}")
    command = typer.main.get_group(module.app) if name in GROUPS else typer.main.get_command(module.app)
    command.name = name
    return command


class _LazyCommands(MutableMapping):
    """The group's command table: names known up front, each command built on first use."""

    def __init__(self) -> None:
        self._built: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self._built:
            self._built[name] = load_command(name)
        return self._built[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        raise TypeError("commands are listed in COMMANDS")

    def __delitem__(self, name: str) -> None:
        raise TypeError("commands are listed in COMMANDS")

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class _LazyGroup(typer.core.TyperGroup):
    def __init__(self, **attrs) -> None:
        super().__init__(**attrs)
        self.commands = _LazyCommands()


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=_LazyGroup,
                  help="Observability and incident diagnosis for vLLM: metrics, GPU counters and stacks on one timeline.")


@app.callback()
def _root() -> None:
    # a callback makes typer build a group; its commands come from COMMANDS
    pass


def main() -> None:
    """Console-script entry point."""
    app()
