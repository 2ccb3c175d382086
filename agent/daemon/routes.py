"""Reading the store from another process: ask the daemon's API, else open the file read-only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from vllm_sentinel.agent.daemon import api
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow, WindowEvaluator, diagnose
from vllm_sentinel.reports.document import diagnose_markdown
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.agent.store.db import Store, StoreLocked


def diagnose_via_best_source(db: str | Path, start_ms: int, end_ms: int, instance: str | None = None,
                             evaluate_window: WindowEvaluator | None = None,
                             rule_paths: list[Path] | None = None, markdown: bool = False,
                             params: Path | None = None) -> dict:
    """The diagnose document from the running daemon if one owns `db`, else from the file itself.

    `rule_paths` (the operator's own rules) travel to the daemon as paths; `evaluate_window`
    serves the read-only path and must evaluate the same rules.
    """
    sock = socket_path_for(db)
    doc = None
    params = {"start_ms": start_ms, "end_ms": end_ms, "instance": instance,
              "rules": json.dumps([str(Path(p).resolve()) for p in rule_paths]) if rule_paths else None,
              "format": "markdown" if markdown else None,
              "params": str(Path(params).resolve()) if params else None}
    try:
        doc = api.call(sock, "/v1/diagnose", params)
    except api.DaemonNotRunning:
        pass
    if doc is not None:
        if "no_data" in doc:
            raise NoDataInWindow(doc["no_data"])
        doc["source"] = f"daemon:{sock}"
        return doc
    try:
        store = Store.open(db, read_only=True)
    except StoreLocked as e:
        raise StoreLocked(f"{e} No daemon answers on {sock}: if a daemon owns the file, it was started "
                          "with another --db path or its API is off.") from None
    with store:
        doc = diagnose(store, start_ms, end_ms, instance, evaluate_window=evaluate_window)
        if markdown:
            doc["markdown"] = diagnose_markdown(store, doc)
        return doc


def daemon_route_diagnose(evaluate_window: WindowEvaluator | None = None,
                          load_rules: Callable[[list[Path] | None, Path | None], WindowEvaluator] | None = None):
    """The daemon's /v1/diagnose handler: same library function, over the daemon's own connection."""
    def handle(store: Store, params: dict) -> dict:
        start_ms, end_ms = int(params["start_ms"]), int(params["end_ms"])
        evaluator = evaluate_window
        if (params.get("rules") or params.get("params")) and load_rules is not None:
            paths = [Path(p) for p in json.loads(params["rules"])] if params.get("rules") else None
            evaluator = load_rules(paths, Path(params["params"]) if params.get("params") else None)
        try:
            doc = diagnose(store, start_ms, end_ms, params.get("instance"), evaluate_window=evaluator)
        except NoDataInWindow as e:
            return {"no_data": str(e)}
        if params.get("format") == "markdown":
            doc["markdown"] = diagnose_markdown(store, doc)
        return doc
    return handle


def daemon_route_report(rules: list | None = None):
    """The daemon's /v1/report handler: write one incident's report where the CLI asked."""
    def handle(store: Store, params: dict) -> dict:
        from vllm_sentinel.reports.assemble import IncidentNotFound
        from vllm_sentinel.reports.write import report_for_incident
        try:
            written = report_for_incident(store, params["id"], Path(params["out"]),
                                          now_ms=int(params["now_ms"]), rules=rules)
        except IncidentNotFound as e:
            return {"not_found": str(e)}
        return {"markdown": str(written.markdown), "charts": [str(c) for c in written.charts]}
    return handle


def status_via_daemon(db: str | Path) -> dict:
    """The daemon's status; raises api.DaemonNotRunning when none owns `db`."""
    return api.call(socket_path_for(db), "/v1/status")


def daemon_route_capture():
    """The daemon's /v1/capture handler: it runs beside vLLM, so it captures and stores."""
    def handle(store: Store, params: dict) -> dict:
        from vllm_sentinel.agent.diagnosis.captures import capture_and_store
        profiler_s = params.get("profiler_s")
        return capture_and_store(store, params["target"], params.get("kind", "dump"),
                                 int(params.get("duration_s", 3)), float(profiler_s) if profiler_s else None)
    return handle
