"""`vllm-sentinel report INCIDENT_ID [--out DIR] [--db PATH]`: one Markdown report with charts.

Mount into the main CLI with `app.command("report")(cli_report.report)` (a one-command command,
not a group). Reads the store read-only; routing through the daemon's API comes later.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, help="Incident reports: Markdown with charts.")
err = Console(stderr=True, soft_wrap=True)  # error lines stay whole

DEFAULT_OUT = Path("vllm-sentinel-reports")


@app.command()
def report(incident_id: str = typer.Argument(..., help="incident id (a unique prefix is enough), as `diagnose` shows it"),
           out_dir: Path = typer.Option(DEFAULT_OUT, "--out", help="reports go to OUT/<incident id>/report.md"),
           db: Optional[Path] = typer.Option(None, "--db", help="DuckDB file (default: $VLLM_SENTINEL_DB, else the "
                                                                "per-user data dir)"),
           rules: Optional[list[Path]] = typer.Option(None, "--rules", help="rule files or directories the incident's "
                                                      "rule is in (default: the shipped rule pack)")) -> None:
    """Write one incident's Markdown report and its chart PNGs; print their paths."""
    from vllm_sentinel.agent.daemon.paths import default_db_path
    from vllm_sentinel.agent.store.db import Store, StoreError
    from vllm_sentinel.reports.assemble import IncidentNotFound, assemble
    from vllm_sentinel.reports.write import write_report

    path = db if db is not None else default_db_path()
    rule_files = None
    if rules:
        from vllm_sentinel.agent.alerts.rulefile import RuleFileError, expand_rule_paths, load_rule_files
        try:
            rule_files = load_rule_files(expand_rule_paths(list(rules)))
        except (RuleFileError, OSError) as e:
            err.print(f"[bold red]error:[/] --rules: {e}", highlight=False)
            raise typer.Exit(2) from None
    from vllm_sentinel.agent.daemon import api
    from vllm_sentinel.agent.daemon.paths import socket_path_for
    try:  # a running daemon holds the file: it writes the report itself
        done = api.call(socket_path_for(path), "/v1/report", {"id": incident_id, "out": str(out_dir.resolve()),
                                                              "now_ms": int(time.time() * 1000)}, timeout=300)
    except api.DaemonNotRunning:
        done = None
    except api.ApiError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    if done is not None:
        if "not_found" in done:
            err.print(f"[bold red]error:[/] {done['not_found']}", highlight=False)
            raise typer.Exit(1)
        for line in [done["markdown"], *done["charts"]]:
            typer.echo(line)
        return
    try:
        store = Store.open(path, read_only=True)
    except StoreError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    try:
        with err.status(f"reading incident {incident_id} and its evidence from {path}"):
            data = assemble(store, incident_id, now_ms=int(time.time() * 1000), rules=rule_files,
                            source=f"duckdb:{path}")
        with err.status("drawing charts"):
            written = write_report(data, out_dir)
    except IncidentNotFound as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        raise typer.Exit(1) from None
    except OSError as e:
        err.print(f"[bold red]error:[/] cannot write the report under {out_dir}: {e}. Pick a writable --out.",
                  highlight=False)
        raise typer.Exit(1) from None
    finally:
        store.close()
    # plain lines, never wrapped: scripts read these paths
    typer.echo(str(written.markdown))
    for png in written.charts:
        typer.echo(str(png))
    for line in data.missing:
        err.print(f"[yellow]not checked:[/] {line}", highlight=False)


if __name__ == "__main__":
    app()
