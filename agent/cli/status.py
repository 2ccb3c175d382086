"""`vllm-sentinel status`: the running daemon's targets and collectors, and their health."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vllm_sentinel.agent.cli.common import DbOption, check_format, db_path, fail, out, print_json
from vllm_sentinel.agent.cli.source import ask_daemon
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.reports.console import render_status

app = typer.Typer(add_completion=False)


@app.command()
def status(db: Optional[Path] = DbOption, fmt: str = typer.Option("table", "--format", help="table or json")) -> None:
    """The daemon's targets and collectors, and their health (enabled, failing, why)."""
    check_format(fmt, ("table", "json"))
    path = db_path(db)
    try:
        doc = ask_daemon(path, "/v1/status")  # only the daemon knows its collectors: no file to fall back on
    except ApiError as e:
        raise fail(str(e)) from None
    if doc is None:
        raise fail(f"no daemon is running for {path} (socket {socket_path_for(path)}). "
                   "Start one with `vllm-sentinel run --target URL`.")
    if fmt == "json":
        print_json(doc)
    else:
        render_status(out, doc)
