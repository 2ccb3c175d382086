"""`vllm-sentinel report INCIDENT_ID [--out DIR] [--db PATH]`: one Markdown report with charts.

The daemon that owns the file writes the report itself; with none running, this process reads
the file read-only and writes it (agent/cli/source.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from vllm_sentinel.agent.alerts.rulefile import expand_rule_paths, load_rule_files
from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.alerts.ruleparams import load_params_file
from vllm_sentinel.agent.cli.common import DbOption, Exit, ParamsOption, db_path, err, fail, window
from vllm_sentinel.agent.cli.prometheus_options import PrometheusArgs, prometheus_options
from vllm_sentinel.agent.cli.source import daemon_or_file
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow
from vllm_sentinel.agent.diagnosis.remote import RecordingRulesMissing, RemoteIncidentNotFound, find_remote_incident
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.promql.remote import RemoteEngine
from vllm_sentinel.agent.store.db import Store, StoreError
from vllm_sentinel.collectors.prometheus import PrometheusError
from vllm_sentinel.reports.assemble import IncidentNotFound, assemble
from vllm_sentinel.reports.assemble_remote import assemble_remote
from vllm_sentinel.reports.markdown import ReportData
from vllm_sentinel.reports.write import WrittenReport, write_report

app = typer.Typer(add_completion=False, help="Incident reports: Markdown with charts.")

DEFAULT_OUT = Path("vllm-sentinel-reports")


@app.command()
@prometheus_options
def report(incident_id: str = typer.Argument(..., help="incident id (a unique prefix is enough), as `diagnose` shows it"),
           out_dir: Path = typer.Option(DEFAULT_OUT, "--out", help="reports go to OUT/<incident id>/report.md"),
           db: Optional[Path] = DbOption,
           rules: Optional[list[Path]] = typer.Option(None, "--rules", help="rule files or directories the incident's "
                                                      "rule is in (default: the shipped rule pack)"),
           since: str = typer.Option("1h", help="with --prometheus: the window diagnose evaluated, ending at --until"),
           until: Optional[str] = typer.Option(None, help="with --prometheus: the window's end (RFC 3339 or Unix s)"),
           params: Optional[Path] = ParamsOption,
           remote: PrometheusArgs = PrometheusArgs()) -> None:
    """Write one incident's Markdown report and its chart PNGs; print their paths."""
    engine = remote.engine(db, params=params, until=until)
    if engine is not None:
        _remote_report(engine, incident_id, window(since, until), rules, params, out_dir)
        return
    path = db_path(db)
    rule_files = None
    if rules:
        try:
            rule_files = load_rule_files(expand_rule_paths(list(rules)))
        except (RuleFileError, OSError) as e:
            raise fail(f"--rules: {e}", Exit.USAGE) from None
    now_ms = int(time.time() * 1000)

    def from_file(store: Store) -> tuple[WrittenReport, ReportData]:
        with err.status(escape(f"reading incident {incident_id} and its evidence from {path}")):
            data = assemble(store, incident_id, now_ms=now_ms, rules=rule_files, source=f"duckdb:{path}")
        with err.status("drawing charts"):
            return write_report(data, out_dir), data

    try:
        answer = daemon_or_file(path, "/v1/report", {"id": incident_id, "out": str(out_dir.resolve()),
                                                     "now_ms": now_ms}, from_file, timeout=300)
    except (ApiError, StoreError, IncidentNotFound) as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"cannot write the report under {out_dir}: {e}. Pick a writable --out.") from None
    if answer.daemon is not None:
        if "not_found" in answer.daemon:
            raise fail(answer.daemon["not_found"])
        for line in [answer.daemon["markdown"], *answer.daemon["charts"]]:
            typer.echo(line)
        for line in answer.daemon.get("missing", []):
            err.print(f"[yellow]not checked:[/] {escape(line)}", highlight=False)
        return
    written, data = answer.file
    # plain lines, never wrapped: scripts read these paths
    typer.echo(str(written.markdown))
    for png in written.charts:
        typer.echo(str(png))
    for line in [*data.missing, *written.missing]:
        err.print(f"[yellow]not checked:[/] {escape(line)}", highlight=False)


def _remote_report(engine: RemoteEngine, incident_id: str, span: tuple[int, int], rules: Optional[list[Path]],
                   params: Optional[Path], out_dir: Path) -> None:
    """Evaluate the window in the Prometheus again, find the incident by its stable id, write its report."""
    start, end = span
    try:
        pack = load_pack(rules, load_params_file(params) if params else None)
    except (RuleFileError, OSError) as e:
        raise fail(str(e)) from None
    try:
        with err.status(escape(f"evaluating the window in {engine.source} to find incident {incident_id}")):
            incident, config, found = find_remote_incident(engine, start, end, pack, incident_id)
            data = assemble_remote(engine, incident, now_ms=end, config=config, related=found, rules=pack)
        with err.status("drawing charts"):
            written = write_report(data, out_dir)
    except (RemoteIncidentNotFound, NoDataInWindow, PrometheusError, RecordingRulesMissing, PromQLError) as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"cannot write the report under {out_dir}: {e}. Pick a writable --out.") from None
    typer.echo(str(written.markdown))
    for png in written.charts:
        typer.echo(str(png))
    for line in [*data.missing, *written.missing]:
        err.print(f"[yellow]not checked:[/] {escape(line)}", highlight=False)
