"""What `compare` reads, from the DuckDB store or from a Prometheus: one CompareSource each.

The store has the sidecar's configuration snapshots (each change recorded with its time) and its
live incidents. An instance no sidecar watched (an ingested dump) and a Prometheus have neither:
there the configuration is what the `_info` series' labels say, and its changes are where those
labels changed (agent/diagnosis/change_points.py); a Prometheus' incidents are the rule pack
replayed in it, as `diagnose --prometheus` does. Restarts are found in the metrics for every
source (compare_windows.py).
"""

from __future__ import annotations

from typing import Any

from vllm_sentinel.agent.alerts.rulemodel import RuleFile
from vllm_sentinel.agent.diagnosis.change_points import info_changes, info_config_at
from vllm_sentinel.agent.diagnosis.compare import CompareRequest, CompareSource
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow, WindowEvaluator, merge_incidents
from vllm_sentinel.agent.diagnosis.incidents import stored_incidents
from vllm_sentinel.agent.diagnosis.liveconfig import load_snapshot_at, snapshot_history
from vllm_sentinel.agent.diagnosis.remote import probe_window, remote_incidents
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.remote import RemoteEngine
from vllm_sentinel.agent.store.config_snapshots import first_config_snapshot
from vllm_sentinel.agent.store.sample_reads import instances_with_samples


def config_change_times(store: Any, instance: str, start_ms: int, end_ms: int) -> list[int]:
    """Times in (start_ms, end_ms] where a snapshot's values differ from the one before (sources aside)."""
    history = snapshot_history(store, instance, start_ms, end_ms)
    return [int(cur.ts_ms) for prev, cur in zip(history, history[1:])
            if cur.values != prev.values and cur.ts_ms is not None and cur.ts_ms > start_ms]


def info_change_times(engine: Any, instance: str, start_ms: int, end_ms: int) -> list[int]:
    """Times in (start_ms, end_ms] where an `_info` series of the instance took other labels."""
    return [p.at_ms for p in info_changes(engine, instance, start_ms, end_ms)]


def store_source(store: Any, evaluate_window: WindowEvaluator | None, name: str = "") -> CompareSource:
    """compare over the DuckDB store: snapshots for the configuration (the `_info` series for an instance no
    sidecar watched), stored plus replayed incidents."""
    engine = Engine(store)
    watched: dict[str, bool] = {}

    def snapshots(instance: str) -> bool:
        if instance not in watched:
            watched[instance] = first_config_snapshot(store, instance) is not None
        return watched[instance]

    def config_at(instance: str, t_ms: int) -> dict[str, Any]:
        if not snapshots(instance):
            return info_config_at(engine, instance, t_ms)
        snap = load_snapshot_at(store, instance, t_ms)
        return dict(snap.values) if snap else {}

    def config_changes(instance: str, lo: int, hi: int) -> list[int]:
        if snapshots(instance):
            return config_change_times(store, instance, lo, hi)
        return info_change_times(engine, instance, lo, hi)

    def incidents(start_ms: int, end_ms: int, instance: str) -> list[dict]:
        replayed = evaluate_window(store, start_ms, end_ms, instance) if evaluate_window else []
        return merge_incidents(stored_incidents(store, start_ms, end_ms, instance), replayed)

    return CompareSource(engine, name or f"duckdb:{store.path}", lambda lo, hi: instances_with_samples(store, lo, hi),
                         config_at, config_changes, incidents)


def remote_source(engine: RemoteEngine, pack: list[RuleFile]) -> CompareSource:
    """compare over a Prometheus: the configuration the `_info` series show, the pack replayed for incidents."""
    def instances(lo: int, hi: int) -> list[str]:
        try:
            return probe_window(engine, lo, hi).instances
        except NoDataInWindow:
            return []

    def incidents(start_ms: int, end_ms: int, instance: str) -> list[dict]:
        try:
            return remote_incidents(engine, start_ms, end_ms, instance, pack)[2]
        except NoDataInWindow:
            return []

    return CompareSource(engine, engine.source, instances, lambda inst, t: info_config_at(engine, inst, t),
                         lambda inst, lo, hi: info_change_times(engine, inst, lo, hi), incidents)


def request_query(req: CompareRequest) -> dict:
    """The request as the daemon's /v1/compare query parameters (inverse: request_from_query)."""
    q: dict[str, Any] = {"stretch": f"{req.stretch[0]},{req.stretch[1]}", "instance": req.instance,
                         "versus": req.versus, "settle_ms": req.settle_ms, "interval_ms": req.interval_ms,
                         "window_ms": req.window_ms, "ttft_slo_s": req.ttft_slo_s, "tpot_slo_s": req.tpot_slo_s,
                         "slo_source": req.slo_source}
    for side in ("before", "after"):
        span = getattr(req, side)
        q[side] = f"{span[0]},{span[1]}" if span else None
    return {k: v for k, v in q.items() if v is not None}


def request_from_query(params: dict) -> CompareRequest:
    """A CompareRequest from /v1/compare query parameters."""
    def span(key: str) -> tuple[int, int] | None:
        if not params.get(key):
            return None
        lo, hi = str(params[key]).split(",")
        return int(lo), int(hi)

    def number(key: str) -> int | None:
        return int(params[key]) if params.get(key) not in (None, "") else None

    def seconds(key: str, default: float) -> float:
        return float(params[key]) if params.get(key) not in (None, "") else default

    stretch = span("stretch")
    assert stretch is not None, "stretch is required"
    defaults = CompareRequest(stretch)
    return CompareRequest(stretch, params.get("instance") or None, params.get("versus") or None, span("before"),
                          span("after"), number("settle_ms") or 0, number("interval_ms"), number("window_ms"),
                          seconds("ttft_slo_s", defaults.ttft_slo_s), seconds("tpot_slo_s", defaults.tpot_slo_s),
                          params.get("slo_source") or defaults.slo_source)
