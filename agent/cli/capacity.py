"""`vllm-sentinel capacity`: the SLO capacity point from history (agent/diagnosis/capacity.py), from the daemon,
the file or a Prometheus, as a table, JSON or Markdown with the load-latency chart."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from vllm_sentinel.agent.cli.common import (DbOption, Exit, ParamsOption, RulesOption, check_format, db_path,
                                            duration_ms, err, fail, out, print_json, window)
from vllm_sentinel.agent.cli.objectives import TpotOption, TtftOption, objectives, pack_values
from vllm_sentinel.agent.cli.prometheus_options import PrometheusArgs, prometheus_options
from vllm_sentinel.agent.cli.source import daemon_or_file
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.diagnosis.capacity import CapacityQuery, NoLoadInWindow, capacity as capacity_doc
from vllm_sentinel.agent.diagnosis.capacity import clamp_to_data
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.store.db import Store, StoreError
from vllm_sentinel.collectors.prometheus import PrometheusError
from vllm_sentinel.reports.capacity import CHART_NAME, capacity_markdown, load_latency_data, render_capacity
from vllm_sentinel.reports.charts import ChartsUnavailable, draw_load_latency_chart

app = typer.Typer(add_completion=False)

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|m|h)|rps)?\s*$")
_PER = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
MIN_BIN_MS = 5000


@app.command()
@prometheus_options
def capacity(ttft_p95: Optional[str] = TtftOption,
             tpot_p95: Optional[str] = TpotOption,
             bin_: str = typer.Option("30s", "--bin", help="time bin: load and latency are read per bin"),
             since: str = typer.Option("24h", help="history to read, ending at --until"),
             until: Optional[str] = typer.Option(None, help="history end: RFC 3339 or Unix seconds (default: now)"),
             instance: Optional[str] = typer.Option(None, help="only this instance"),
             target_rate: Optional[str] = typer.Option(None, "--target-rate", help="plan replicas for this "
                                                       "request rate, e.g. 20/s or 1200/m"),
             target_rps: Optional[float] = typer.Option(None, "--target-rps", help="the same in requests/s"),
             knee_factor: float = typer.Option(2.0, "--knee-factor", help="the knee: the first load level whose "
                                               "p95 exceeds this many times the lowest level's"),
             fmt: str = typer.Option("table", "--format", help="table, markdown or json"),
             out_dir: Optional[Path] = typer.Option(None, "--out", help="with --format markdown: write "
                                                    "capacity.md and the load-latency chart PNG here"),
             rules: Optional[list[Path]] = RulesOption,
             params: Optional[Path] = ParamsOption,
             db: Optional[Path] = DbOption,
             remote: PrometheusArgs = PrometheusArgs()) -> None:
    """The highest load that met the latency objectives, the knee, and replicas for a target rate."""
    check_format(fmt, ("table", "markdown", "json"))
    if out_dir is not None and fmt != "markdown":
        raise fail("--out writes the Markdown report and its chart: use it with --format markdown", Exit.USAGE)
    if knee_factor <= 1:
        raise fail(f"--knee-factor {knee_factor:g}: must be above 1 (latency rising by that factor)", Exit.USAGE)
    engine = remote.engine(db)
    start, end = window(since, until)
    query = _query(start, end, bin_, ttft_p95, tpot_p95, instance, _target(target_rate, target_rps), knee_factor,
                   rules, params)
    try:
        with err.status(escape(f"reading {since} of history in {query.bin_ms // 1000} s bins")):
            if engine is not None:
                doc = capacity_doc(engine, query, source=engine.source)
            else:
                doc = _local(db_path(db), query)
    except (NoLoadInWindow, StoreError, ApiError, PrometheusError, PromQLError) as e:
        raise fail(str(e)) from None
    _print(doc, fmt, out_dir)


def _local(db: Path, query: CapacityQuery) -> dict:
    """The document from the daemon that owns `db`, else from the file read-only."""
    def from_file(store: Store) -> dict:
        return capacity_doc(Engine(store), clamp_to_data(query, store.time_range()), source=f"duckdb:{db}")

    answer = daemon_or_file(db, "/v1/capacity", query.as_params(), from_file, timeout=300)
    return answer.document({"no_data": NoLoadInWindow})


def _query(start: int, end: int, bin_: str, ttft: Optional[str], tpot: Optional[str], instance: Optional[str],
           target: Optional[float], knee_factor: float, rules: Optional[list[Path]],
           params: Optional[Path]) -> CapacityQuery:
    """The CapacityQuery of the options: objectives given, else the rule pack's parameters."""
    bin_ms = duration_ms(bin_, "--bin")
    if bin_ms < MIN_BIN_MS or bin_ms % 1000:
        raise fail(f"--bin {bin_}: use whole seconds, at least {MIN_BIN_MS // 1000}s (e.g. 30s, 1m)", Exit.USAGE)
    if bin_ms > end - start:
        raise fail(f"--bin {bin_} is longer than --since: take a shorter bin or a longer window", Exit.USAGE)
    values, where = pack_values(rules, params)
    ttft_s, tpot_s, source = objectives(ttft, tpot, values, where)
    return CapacityQuery(start, end, bin_ms, ttft_s, tpot_s, source, instance, target, knee_factor,
                         float(values.get("hol_prompt_spread_ratio", 4)), float(values.get("hol_itl_spike_ratio", 5)))


def _target(text: Optional[str], rps: Optional[float]) -> Optional[float]:
    """--target-rate (20/s, 1200/m, 20rps) or --target-rps in requests per second; both or a bad one exits 2."""
    if text is not None and rps is not None:
        raise fail("--target-rate and --target-rps say the same thing: give one", Exit.USAGE)
    if text is not None:
        m = _RATE_RE.match(text)
        if not m:
            raise fail(f"--target-rate {text!r} is not a rate; use forms like 20/s, 1200/m, 20rps", Exit.USAGE)
        rps = float(m.group(1)) / _PER[m.group(2)]
    if rps is not None and not 0 < rps < 1e9:
        raise fail(f"--target-rps {rps:g}: a target rate must be above zero", Exit.USAGE)
    return rps


def _print(doc: dict, fmt: str, out_dir: Optional[Path]) -> None:
    if fmt == "json":
        print_json(doc)
    elif fmt == "table":
        render_capacity(out, doc)
    elif out_dir is None:
        sys.stdout.write(capacity_markdown(doc))
        err.print("[yellow]no chart:[/] pass --out DIR to write the load-latency chart beside the Markdown",
                  highlight=False)
    else:
        _write_markdown(doc, out_dir)


def _write_markdown(doc: dict, out_dir: Path) -> None:
    """capacity.md and its chart under out_dir; their paths on stdout (a missing matplotlib is said, not fatal)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        chart: Optional[Path] = None
        try:
            chart = draw_load_latency_chart(load_latency_data(doc), out_dir / CHART_NAME)
        except ChartsUnavailable as e:
            err.print(f"[yellow]not checked:[/] {escape(str(e))}", highlight=False)
        md = out_dir / "capacity.md"
        md.write_text(capacity_markdown(doc, chart.name if chart else None))
    except OSError as e:
        raise fail(f"cannot write under {out_dir}: {e}. Pick a writable --out.") from None
    typer.echo(str(md))
    if chart:
        typer.echo(str(chart))
