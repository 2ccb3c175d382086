"""`vllm-sentinel compare`: verify a fix: signals before and after a configuration change, with a verdict."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from vllm_sentinel.agent.alerts.rulemodel import RuleFile, RuleFileError
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.cli.common import (DbOption, Exit, ParamsOption, RulesOption, check_format, db_path,
                                            duration_ms, err, fail, out, print_json, window)
from vllm_sentinel.agent.cli.objectives import TpotOption, TtftOption, objectives, pack_values
from vllm_sentinel.agent.cli.prometheus_options import PrometheusArgs, prometheus_options
from vllm_sentinel.agent.cli.source import daemon_or_file
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.diagnosis.compare import (CompareError, CompareRequest, NoChangeFound, NoDataInWindow,
                                                   compare as compare_windows)
from vllm_sentinel.agent.diagnosis.compare_sources import request_query, store_source
from vllm_sentinel.agent.diagnosis.compare_sources import remote_source as remote_compare_source
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.store.db import StoreError
from vllm_sentinel.collectors.prometheus import PrometheusError
from vllm_sentinel.collectors.timefmt import parse_span_ms
from vllm_sentinel.reports.compare_view import compare_markdown, render_compare

app = typer.Typer(add_completion=False)


@app.command()
@prometheus_options
def compare(change: str = typer.Option("auto", "--change", help="auto: around the latest configuration change or "
                                       "restart in --since/--until (unless --before/--after are given)"),
            before: Optional[str] = typer.Option(None, "--before", help="START..END: times (RFC 3339, Unix s) or "
                                                 "durations ago, e.g. 2h..1h"),
            after: Optional[str] = typer.Option(None, "--after", help="START..END, as --before, e.g. 50m..now"),
            instance: Optional[str] = typer.Option(None, help="the instance (default: the only one with data)"),
            versus: Optional[str] = typer.Option(None, help="a second instance, over the same window as --instance "
                                                 "(a canary): --instance is before, --versus after"),
            since: str = typer.Option("6h", help="the stretch searched for the change (or, with --versus, compared), "
                                      "ending at --until"),
            until: Optional[str] = typer.Option(None, help="its end: RFC 3339 or Unix seconds (default: now)"),
            settle: str = typer.Option("60s", help="left out after a change before the after-window starts"),
            window_len: Optional[str] = typer.Option(None, "--window", help="at most this long a side (default: "
                                                     "as long as the data either side allows)"),
            interval: Optional[str] = typer.Option(None, help="interval the significance test compares (default: "
                                                   "a twelfth of the window, 10 s at least)"),
            ttft_p95: Optional[str] = TtftOption,
            tpot_p95: Optional[str] = TpotOption,
            fmt: str = typer.Option("table", "--format", help="table, markdown or json"),
            out_dir: Optional[Path] = typer.Option(None, "--out", help="with --format markdown: write compare.md "
                                                   "and its charts into this directory"),
            rules: Optional[list[Path]] = RulesOption,
            params: Optional[Path] = ParamsOption,
            db: Optional[Path] = DbOption,
            remote: PrometheusArgs = PrometheusArgs()) -> None:
    """Verify a fix: goodput, SLO attainment and signals before and after a change, tested against the noise."""
    check_format(fmt, ("table", "markdown", "json"))
    if out_dir is not None and fmt != "markdown":
        raise fail("--out writes the Markdown and its charts: use it with --format markdown", Exit.USAGE)
    engine = remote.engine(db)
    req = _request(change, before, after, instance, versus, since, until, settle, window_len, interval)
    ttft_s, tpot_s, slo_source = objectives(ttft_p95, tpot_p95, *pack_values(rules, params))
    req = dataclasses.replace(req, ttft_slo_s=ttft_s, tpot_slo_s=tpot_s, slo_source=slo_source)
    try:
        with err.status("comparing the windows (incidents replayed over each)"):
            pack = load_pack(rules, params)
            if engine is not None:
                doc = compare_windows(remote_compare_source(engine, pack), req)
            else:
                doc = _from_store(db_path(db), req, pack)
    except (NoDataInWindow, NoChangeFound, CompareError, StoreError, ApiError, PrometheusError, PromQLError,
            RuleFileError) as e:
        raise fail(str(e)) from None
    _print(doc, fmt, out_dir)


def _request(change: str, before: Optional[str], after: Optional[str], instance: Optional[str],
             versus: Optional[str], since: str, until: Optional[str], settle: str, window_len: Optional[str],
             interval: Optional[str]) -> CompareRequest:
    """The options as a CompareRequest; a bad one exits 2 naming it."""
    if change != "auto":
        raise fail(f"--change {change!r}: only auto (the latest change) is known; or give --before and --after",
                   Exit.USAGE)
    if bool(before) != bool(after) and not versus:
        raise fail("--before and --after go together (or neither: the latest change is found)", Exit.USAGE)
    if versus and not instance:
        raise fail("--versus B compares B with --instance A over the same window: give --instance too", Exit.USAGE)
    stretch = window(since, until)
    if stretch[1] <= stretch[0]:
        raise fail(f"--since {since}: give a positive duration", Exit.USAGE)
    now = stretch[1] if until else int(time.time() * 1000)
    spans = []
    for flag, text in (("--before", before), ("--after", after)):
        try:
            spans.append(parse_span_ms(text, now) if text else None)
        except ValueError as e:
            raise fail(f"{flag}: {e}", Exit.USAGE) from None
    settle_ms = duration_ms(settle, "--settle")
    window_ms = duration_ms(window_len, "--window") if window_len else None
    interval_ms = duration_ms(interval, "--interval") if interval else None
    if interval_ms is not None and interval_ms < 1000:
        raise fail(f"--interval {interval}: give 1s or more (a rate needs scrapes inside each interval)", Exit.USAGE)
    if window_ms is not None and window_ms <= 0:
        raise fail(f"--window {window_len}: give a positive duration", Exit.USAGE)
    return CompareRequest(stretch, instance, versus, spans[0], spans[1], settle_ms, interval_ms, window_ms)


def _from_store(db: Path, req: CompareRequest, pack: list[RuleFile]) -> dict:
    """The compare document from the daemon that owns `db` (its own rules replayed), else from the file read-only."""
    def from_file(store: object) -> dict:
        return compare_windows(store_source(store, pack_window_evaluator(pack)), req)

    answer = daemon_or_file(db, "/v1/compare", request_query(req), from_file, timeout=300.0)
    return answer.document({"no_data": NoDataInWindow, "compare_error": CompareError})


def _print(doc: dict, fmt: str, out_dir: Optional[Path]) -> None:
    if fmt == "json":
        print_json({k: v for k, v in doc.items() if k != "intervals"})
    elif fmt == "markdown":
        text = compare_markdown(doc, out_dir)
        if out_dir is None:
            sys.stdout.write(text)
            return
        path = out_dir / "compare.md"
        path.write_text(text, encoding="utf-8")
        out.print(f"Written: {path}", highlight=False)
    else:
        render_compare(out, doc)
