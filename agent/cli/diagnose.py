"""`vllm-sentinel diagnose`: incidents, evidence, fixes and health over a window, from the daemon or the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.alerts.ruleparams import ParamOverrides, load_params_file
from vllm_sentinel.agent.cli.common import (DbOption, ParamsOption, RulesOption, check_format, db_path, err, fail, out,
                                            print_json, window)
from vllm_sentinel.agent.cli.source import daemon_or_file
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow, WindowEvaluator, diagnose as diagnose_window
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.store.db import Store, StoreError
from vllm_sentinel.reports.console import render_diagnosis
from vllm_sentinel.reports.document import diagnose_markdown

app = typer.Typer(add_completion=False)


@app.command()
def diagnose(since: str = typer.Option("1h", help="window length, ending at --until"),
             until: Optional[str] = typer.Option(None, help="window end: RFC 3339 or Unix seconds (default: now)"),
             instance: Optional[str] = typer.Option(None, help="only this instance"),
             fmt: str = typer.Option("table", "--format", help="table, markdown or json"),
             rules: Optional[list[Path]] = RulesOption,
             params: Optional[Path] = ParamsOption,
             db: Optional[Path] = DbOption) -> None:
    """Incidents with evidence and fixes, and a health summary, over a window of history."""
    check_format(fmt, ("table", "markdown", "json"))
    start, end = window(since, until)
    try:
        # --params is read once, here: the daemon gets its values, not the path to read again
        overrides = load_params_file(params) if params else None
        pack = load_pack(rules, overrides)
    except (RuleFileError, OSError) as e:
        raise fail(str(e)) from None
    try:
        # a long window or a large fleet takes seconds: say what is happening (on stderr, so JSON stays clean)
        with err.status(f"evaluating {len(pack)} rule file(s) over {since} of history"):
            doc = diagnose_document(db_path(db), start, end, instance, pack_window_evaluator(pack), rules,
                                    overrides, markdown=fmt == "markdown")
    except (NoDataInWindow, StoreError, ApiError) as e:
        raise fail(str(e)) from None
    if fmt == "json":
        print_json(doc)
    elif fmt == "markdown":
        sys.stdout.write(doc["markdown"])
    else:
        render_diagnosis(out, doc, fmt)


def diagnose_document(db: Path, start_ms: int, end_ms: int, instance: Optional[str],
                      evaluate_window: WindowEvaluator, rule_paths: Optional[list[Path]],
                      overrides: Optional[ParamOverrides], markdown: bool = False) -> dict:
    """The diagnose document from the daemon that owns `db`, else from the file read-only.

    The daemon gets the operator's rules as absolute paths and the parsed --params as values;
    `evaluate_window` serves the file and evaluates the same rules.
    """
    query = {"start_ms": start_ms, "end_ms": end_ms, "instance": instance,
             "rules": json.dumps([str(Path(p).resolve()) for p in rule_paths]) if rule_paths else None,
             "format": "markdown" if markdown else None,
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
