"""The daemon's API route handlers: the same library functions as the CLI, over the daemon's own connection.

Each handler gets a reader view of the store and the request's query parameters; the CLI side
(what to ask, and the read-only file when no daemon runs) is agent/cli/source.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from vllm_sentinel.agent.alerts.ruleparams import ParamOverrides
from vllm_sentinel.agent.diagnosis.capacity import CapacityQuery, NoLoadInWindow, capacity, clamp_to_data
from vllm_sentinel.agent.diagnosis.captures import capture_and_store
from vllm_sentinel.agent.diagnosis.compare import CompareError, NoChangeFound, compare
from vllm_sentinel.agent.diagnosis.compare_sources import request_from_query, store_source
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow, WindowEvaluator, diagnose
from vllm_sentinel.agent.diagnosis.sim_calibrate import Unrepresentable
from vllm_sentinel.agent.diagnosis.sim_workload import NotEnoughTraffic
from vllm_sentinel.agent.diagnosis.whatif import WhatIfQuery, store_configs, whatif
from vllm_sentinel.agent.diagnosis.whatif_knobs import BadKnob
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.reports.assemble import IncidentNotFound
from vllm_sentinel.reports.chart_process import draw_in_child
from vllm_sentinel.reports.document import diagnose_markdown
from vllm_sentinel.reports.write import report_for_incident

Route = Callable[[Store, dict], dict]
# (the CLI's --rules paths or None, its parsed --params or None) -> the evaluator for that request
LoadRules = Callable[[list[Path] | None, ParamOverrides | None], WindowEvaluator]


def param_overrides_from_query(text: str) -> ParamOverrides:
    """The `params` query value (JSON {values, source}, parsed once by the CLI) as ParamOverrides."""
    doc = json.loads(text)
    return ParamOverrides(dict(doc["values"]), str(doc["source"]))


def daemon_route_diagnose(evaluate_window: WindowEvaluator | None = None, load_rules: LoadRules | None = None) -> Route:
    """The daemon's /v1/diagnose handler; the CLI's own --rules (paths) and --params (values) replace the daemon's."""
    def handle(store: Store, params: dict) -> dict:
        start_ms, end_ms = int(params["start_ms"]), int(params["end_ms"])
        evaluator = evaluate_window
        if (params.get("rules") or params.get("params")) and load_rules is not None:
            paths = [Path(p) for p in json.loads(params["rules"])] if params.get("rules") else None
            overrides = param_overrides_from_query(params["params"]) if params.get("params") else None
            evaluator = load_rules(paths, overrides)
        if params.get("reuse_live") and hasattr(evaluator, "reusing_live"):
            evaluator = evaluator.reusing_live()
        try:
            doc = diagnose(store, start_ms, end_ms, params.get("instance"), evaluate_window=evaluator)
        except NoDataInWindow as e:
            return {"no_data": str(e)}
        if params.get("format") == "markdown":
            doc["markdown"] = diagnose_markdown(store, doc)
        return doc
    return handle


def daemon_route_report(rules: list | None = None) -> Route:
    """The daemon's /v1/report handler: write one incident's report where the CLI asked."""
    def handle(store: Store, params: dict) -> dict:
        try:
            written = report_for_incident(store, params["id"], Path(params["out"]),
                                          now_ms=int(params["now_ms"]), rules=rules, draw=draw_in_child)
        except IncidentNotFound as e:
            return {"not_found": str(e)}
        return {"markdown": str(written.markdown), "charts": [str(c) for c in written.charts],
                "missing": written.missing}
    return handle


def daemon_route_capture() -> Route:
    """The daemon's /v1/capture handler: it runs beside vLLM, so it captures and stores."""
    def handle(store: Store, params: dict) -> dict:
        profiler_s = params.get("profiler_s")
        return capture_and_store(store, params["target"], params.get("kind", "dump"),
                                 int(params.get("duration_s", 3)), float(profiler_s) if profiler_s else None)
    return handle


def daemon_route_capacity() -> Route:
    """The daemon's /v1/capacity handler: capacity's document over its own file (the CLI sends a CapacityQuery)."""
    def handle(store: Store, params: dict) -> dict:
        try:
            query = clamp_to_data(CapacityQuery.from_params(params), store.time_range())
            return capacity(Engine(store), query, source=f"duckdb:{store.path}")
        except NoLoadInWindow as e:
            return {"no_data": str(e)}
    return handle


def daemon_route_whatif() -> Route:
    """The daemon's /v1/whatif handler: the model over its own file (the CLI sends a WhatIfQuery)."""
    def handle(store: Store, params: dict) -> dict:
        query = WhatIfQuery.from_params(params)
        try:
            return whatif(Engine(store), store_configs(store, query.start_ms, query.end_ms), query,
                          source=f"duckdb:{store.path}")
        except (NotEnoughTraffic, Unrepresentable, BadKnob) as e:
            return {"model_error": str(e)}
    return handle


def daemon_route_compare(evaluate_window: WindowEvaluator | None = None) -> Route:
    """The daemon's /v1/compare handler: compare over the daemon's own connection, errors as one message."""
    def handle(store: Store, params: dict) -> dict:
        try:
            return compare(store_source(store, evaluate_window), request_from_query(params))
        except NoDataInWindow as e:
            return {"no_data": str(e)}
        except (CompareError, NoChangeFound) as e:
            return {"compare_error": str(e)}
    return handle
