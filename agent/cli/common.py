"""What every command shares: the consoles, the common options, exit codes, `fail`, windows, JSON out."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from vllm_sentinel.agent.daemon.paths import default_db_path
from vllm_sentinel.collectors.timefmt import parse_cli_duration_ms, parse_time_ms

out = Console()
err = Console(stderr=True, soft_wrap=True)  # error lines stay whole for grep and logs

DbOption = typer.Option(None, "--db", help="DuckDB file (default: $VLLM_SENTINEL_DB, else the per-user data dir)")
RulesOption = typer.Option(None, "--rules", help="rule file or folder (repeatable; default: the shipped pack)")
ParamsOption = typer.Option(None, "--params", help="YAML file overriding rule thresholds (name: value)")


class Exit:
    """Exit codes: 0 ok, 1 domain problem (no data, locked, bad input), 2 usage."""

    OK, PROBLEM, USAGE = 0, 1, 2


def fail(message: str, code: int = Exit.PROBLEM) -> typer.Exit:
    """Print one clear line to stderr and return the exit to raise."""
    # the message quotes the operator's input and file contents: shown as text, never as rich markup
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def check_format(fmt: str, allowed: tuple[str, ...]) -> None:
    """Refuse a --format outside `allowed` (exit 2), naming the ones there are."""
    if fmt not in allowed:
        choices = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
        raise fail(f"--format {fmt!r}: use {choices}", Exit.USAGE)


def db_path(db: Optional[Path]) -> Path:
    """--db as given, else the default store ($VLLM_SENTINEL_DB or the per-user data dir)."""
    return db if db is not None else default_db_path()


def duration_ms(text: str, flag: str = "") -> int:
    """A CLI duration (90s, 15m, 1h30m) in ms; a bad one exits 2, prefixed with `flag` when given."""
    try:
        return parse_cli_duration_ms(text)
    except ValueError as e:
        raise fail(f"{flag}: {e}" if flag else str(e), Exit.USAGE) from None


def duration_s(text: str, flag: str = "") -> float:
    """A CLI duration in seconds (see duration_ms)."""
    return duration_ms(text, flag) / 1000


def window(since: str, until: Optional[str]) -> tuple[int, int]:
    """(start_ms, end_ms) of `--since` ending at `--until` (default: now); a bad value exits 2."""
    try:
        end = parse_time_ms(until) if until else int(time.time() * 1000)
        length = parse_cli_duration_ms(since)
    except ValueError as e:
        raise fail(str(e), Exit.USAGE) from None
    if length <= 0:
        raise fail(f"--since {since}: the window is empty; give a length above zero, e.g. --since 15m", Exit.USAGE)
    return end - length, end


def print_json(doc: Any) -> None:
    """The document as indented JSON on stdout (nothing else goes there)."""
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
