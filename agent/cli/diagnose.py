"""`vllm-sentinel diagnose`: incidents, evidence, fixes and health over a window, from the daemon or the file."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.alerts.ruleparams import ParamOverrides, load_params_file
from vllm_sentinel.agent.cli.common import (DbOption, ParamsOption, RulesOption, check_format, db_path, err, fail,
                                            out, print_json, window)
from vllm_sentinel.agent.cli.prometheus_options import PrometheusArgs, prometheus_options
from vllm_sentinel.agent.cli.source import daemon_or_file
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow, WindowEvaluator, diagnose as diagnose_window
from vllm_sentinel.agent.diagnosis.remote import RecordingRulesMissing, diagnose_remote
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.promql.remote import RemoteEngine
from vllm_sentinel.agent.promql.scope import format_selector
from vllm_sentinel.agent.store.db import Store, StoreError
from vllm_sentinel.collectors.prometheus import PrometheusError
from vllm_sentinel.collectors.timefmt import iso_seconds
from vllm_sentinel.reports.assemble_remote import assemble_remote
from vllm_sentinel.reports.console import render_diagnosis
from vllm_sentinel.reports.document import diagnose_markdown

app = typer.Typer(add_completion=False)


@app.command()
@prometheus_options
def diagnose(since: str = typer.Option("1h", help="window length, ending at --until"),
             until: Optional[str] = typer.Option(None, help="window end: RFC 3339 or Unix seconds (default: now)"),
             instance: Optional[str] = typer.Option(None, help="only this instance"),
             fmt: str = typer.Option("table", "--format", help="table, markdown or json"),
             rules: Optional[list[Path]] = RulesOption,
             params: Optional[Path] = ParamsOption,
             db: Optional[Path] = DbOption,
             reuse_live: bool = typer.Option(
                 False, "--reuse-live",
                 help="where the daemon evaluated these rules live, take its incidents instead of replaying "
                      "(much faster over long windows; on a starved host the live evaluation can miss what a "
                      "replay finds)"),
             remote: PrometheusArgs = PrometheusArgs()) -> None:
    """Incidents with evidence and fixes, and a health summary, over a window of history."""
    check_format(fmt, ("table", "markdown", "json"))
    start, end = window(since, until)  # a bad flag is named before any file or server is looked at
    engine = remote.engine(db)
    try:
        # --params is read once, here: the daemon gets its values, not the path to read again
        overrides = load_params_file(params) if params else None
        pack = load_pack(rules, overrides)
    except (RuleFileError, OSError) as e:
        raise fail(str(e)) from None
    if engine is not None:
        doc = _remote_document(engine, start, end, instance, pack, since, fmt == "markdown", rules, params)
        _print(doc, fmt)
        return
    try:
        # a long window or a large fleet takes seconds: say what is happening (on stderr, so JSON stays clean)
        with err.status(f"evaluating {len(pack)} rule file(s) over {since} of history"):
            doc = diagnose_document(db_path(db), start, end, instance, pack_window_evaluator(pack, reuse_live),
                                    rules, overrides, markdown=fmt == "markdown", reuse_live=reuse_live)
    except (NoDataInWindow, StoreError, ApiError) as e:
        raise fail(str(e)) from None
    _print(doc, fmt)


def _print(doc: dict, fmt: str) -> None:
    if fmt == "json":
        print_json({k: v for k, v in doc.items() if k != "markdown"})
    elif fmt == "markdown":
        sys.stdout.write(doc["markdown"])
    else:
        render_diagnosis(out, doc, fmt)


def _remote_document(engine: RemoteEngine, start: int, end: int, instance: Optional[str], pack: list,
                     since: str, markdown: bool, rules: Optional[list[Path]], params: Optional[Path]) -> dict:
    """The diagnose document from a Prometheus, each incident with the `report` command that finds it again."""
    # Prometheus' API reads whole seconds; a whole-second window is also one the report command can repeat
    span = end - start
    end = end // 1000 * 1000
    start = end - span
    try:
        with err.status(escape(f"evaluating {len(pack)} rule file(s) over {since} of history in {engine.source}")):
            doc = diagnose_remote(engine, start, end, instance, pack)
            for inc in doc["incidents"]:
                inc["report"] = report_command(engine, inc["id"], start, end, rules, params)
            if markdown:
                config = doc.get("config") or {}
                doc["markdown"] = diagnose_markdown(None, doc, assemble_one=lambda inc: assemble_remote(
                    engine, inc, now_ms=end, config=config.get(inc.get("instance") or ""), related=doc["incidents"]))
    except (NoDataInWindow, PrometheusError, RecordingRulesMissing, PromQLError) as e:
        raise fail(str(e)) from None
    return doc


def report_command(engine: RemoteEngine, incident_id: str, start: int, end: int, rules: Optional[list[Path]],
                   params: Optional[Path] = None) -> str:
    """The `vllm-sentinel report` line that re-evaluates this window in the same Prometheus and finds the id."""
    words = ["vllm-sentinel", "report", incident_id[:12], "--prometheus", engine.client.url,
             "--since", _duration(end - start), "--until", iso_seconds(end)]
    if engine.selector:
        words += ["--selector", format_selector(engine.selector)]
    for r in rules or []:
        words += ["--rules", str(r)]
    if params is not None:
        words += ["--params", str(params)]
    return " ".join(shlex.quote(w) for w in words)


def _duration(ms: int) -> str:
    """A --since value for a span: 600000 -> '600s', 1500 -> '1500ms'."""
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def diagnose_document(db: Path, start_ms: int, end_ms: int, instance: Optional[str],
                      evaluate_window: WindowEvaluator, rule_paths: Optional[list[Path]],
                      overrides: Optional[ParamOverrides], markdown: bool = False, reuse_live: bool = False) -> dict:
    """The diagnose document from the daemon that owns `db`, else from the file read-only.

    The daemon gets the operator's rules as absolute paths and the parsed --params as values;
    `evaluate_window` serves the file and evaluates the same rules.
    """
    query = {"start_ms": start_ms, "end_ms": end_ms, "instance": instance,
             "rules": json.dumps([str(Path(p).resolve()) for p in rule_paths]) if rule_paths else None,
             "format": "markdown" if markdown else None, "reuse_live": "1" if reuse_live else None,
             "params": json.dumps({"values": overrides.values, "source": overrides.source}) if overrides else None}

    def from_file(store: Store) -> dict:
        doc = diagnose_window(store, start_ms, end_ms, instance, evaluate_window=evaluate_window)
        if markdown:
            doc["markdown"] = diagnose_markdown(store, doc)
        return doc

    answer = daemon_or_file(db, "/v1/diagnose", query, from_file)
    if answer.daemon is None:
        return answer.file
    if "no_data" in answer.daemon:
        raise NoDataInWindow(answer.daemon["no_data"])
    return {**answer.daemon, "source": f"daemon:{answer.socket}"}
