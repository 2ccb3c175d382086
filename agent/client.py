"""Reading the store from another process: ask the daemon's API, else open the file read-only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from vllm_sentinel.agent import api
from vllm_sentinel.agent.diagnose import NoDataInWindow, WindowEvaluator, diagnose
from vllm_sentinel.agent.paths import socket_path_for
from vllm_sentinel.agent.store import Store, StoreLocked


def diagnose_via_best_source(db: str | Path, start_ms: int, end_ms: int, instance: str | None = None,
                             evaluate_window: WindowEvaluator | None = None,
                             rule_paths: list[Path] | None = None) -> dict:
    """The diagnose document from the running daemon if one owns `db`, else from the file itself.

    `rule_paths` (the operator's own rules) travel to the daemon as paths; `evaluate_window`
    serves the read-only path and must evaluate the same rules.
    """
    sock = socket_path_for(db)
    doc = None
    params = {"start_ms": start_ms, "end_ms": end_ms, "instance": instance,
              "rules": json.dumps([str(Path(p).resolve()) for p in rule_paths]) if rule_paths else None}
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
        return diagnose(store, start_ms, end_ms, instance, evaluate_window=evaluate_window)


def daemon_route_diagnose(evaluate_window: WindowEvaluator | None = None,
                          load_rules: Callable[[list[Path]], WindowEvaluator] | None = None):
    """The daemon's /v1/diagnose handler: same library function, over the daemon's own connection."""
    def handle(store: Store, params: dict) -> dict:
        start_ms, end_ms = int(params["start_ms"]), int(params["end_ms"])
        evaluator = evaluate_window
        if params.get("rules") and load_rules is not None:
            evaluator = load_rules([Path(p) for p in json.loads(params["rules"])])
        try:
            return diagnose(store, start_ms, end_ms, params.get("instance"), evaluate_window=evaluator)
        except NoDataInWindow as e:
            return {"no_data": str(e)}
    return handle


def status_via_daemon(db: str | Path) -> dict:
    """The daemon's status; raises api.DaemonNotRunning when none owns `db`."""
    return api.call(socket_path_for(db), "/v1/status")
