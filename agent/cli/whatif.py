"""`vllm-sentinel whatif`: a window's workload replayed through the server's calibrated model, as configured and
as asked (`--set`, `--replicas`, `--rate`), from the daemon, the file or a Prometheus."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from vllm_sentinel.agent.cli.common import (DbOption, Exit, ParamsOption, RulesOption, check_format, db_path, err,
                                            fail, out, print_json, window)
from vllm_sentinel.agent.cli.objectives import TpotOption, TtftOption, objectives, pack_values
from vllm_sentinel.agent.cli.prometheus_options import PrometheusArgs, prometheus_options
from vllm_sentinel.agent.cli.source import daemon_or_file
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.diagnosis.sim_calibrate import Unrepresentable
from vllm_sentinel.agent.diagnosis.sim_workload import NotEnoughTraffic
from vllm_sentinel.agent.diagnosis.whatif import WhatIfQuery, remote_configs, store_configs, whatif as whatif_doc
from vllm_sentinel.agent.diagnosis.whatif_knobs import KNOBS, BadKnob, parse_rate, parse_sets
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.store.db import Store, StoreError
from vllm_sentinel.collectors.prometheus import PrometheusError
from vllm_sentinel.reports.whatif_view import render_whatif, whatif_markdown

app = typer.Typer(add_completion=False)

# what the model refuses, each with the fix in its message
ModelErrors = (NotEnoughTraffic, Unrepresentable, BadKnob)


@app.command()
@prometheus_options
def whatif(since: str = typer.Option("30m", help="the window whose workload is replayed, ending at --until"),
           until: Optional[str] = typer.Option(None, help="its end: RFC 3339 or Unix seconds (default: now)"),
           instance: Optional[str] = typer.Option(None, help="the instance (default: the only one that served "
                                                  "requests)"),
           set_: Optional[list[str]] = typer.Option(None, "--set", help="an engine parameter to change, NAME=VALUE "
                                                    f"(repeatable): {', '.join(KNOBS)}"),
           replicas: int = typer.Option(1, "--replicas", min=1, max=1000, help="split the load over this many "
                                        "replicas of the server"),
           rate: Optional[str] = typer.Option(None, "--rate", help="scale the arrival rate (or the clients of a "
                                              "closed loop), e.g. x1.5"),
           ttft_p95: Optional[str] = TtftOption,
           tpot_p95: Optional[str] = TpotOption,
           seed: int = typer.Option(0, "--seed", help="the seed of the replayed requests' lengths and arrival times"),
           fmt: str = typer.Option("table", "--format", help="table, markdown or json"),
           rules: Optional[list[Path]] = RulesOption,
           params: Optional[Path] = ParamsOption,
           db: Optional[Path] = DbOption,
           remote: PrometheusArgs = PrometheusArgs()) -> None:
    """Predict latency, preemptions, throughput and goodput under another configuration, from a calibrated model."""
    check_format(fmt, ("table", "markdown", "json"))
    start, end = window(since, until)
    try:
        sets = tuple(parse_sets(set_ or []))
        factor = parse_rate(rate)
    except BadKnob as e:
        raise fail(str(e), Exit.USAGE) from None
    values, where = pack_values(rules, params)
    ttft_s, tpot_s, source = objectives(ttft_p95, tpot_p95, values, where)
    query = WhatIfQuery(start, end, instance, sets, replicas, factor, ttft_s, tpot_s, source, seed=seed)
    engine = remote.engine(db)
    try:
        with err.status(escape(f"replaying {since} of workload through the model")):
            if engine is not None:
                doc = whatif_doc(engine, remote_configs(engine, start, end), query, source=engine.source)
            else:
                doc = _local(db_path(db), query)
    except BadKnob as e:
        raise fail(str(e), Exit.USAGE) from None
    except (*ModelErrors, StoreError, ApiError, PrometheusError, PromQLError) as e:
        raise fail(str(e)) from None
    if fmt == "json":
        print_json(doc)
    elif fmt == "markdown":
        sys.stdout.write(whatif_markdown(doc))
    else:
        render_whatif(out, doc)


def _local(db: Path, query: WhatIfQuery) -> dict:
    """The document from the daemon that owns `db`, else from the file read-only."""
    def from_file(store: Store) -> dict:
        return whatif_doc(Engine(store), store_configs(store, query.start_ms, query.end_ms), query,
                          source=f"duckdb:{db}")

    answer = daemon_or_file(db, "/v1/whatif", query.as_params(), from_file, timeout=300)
    return answer.document({"model_error": Unrepresentable})
