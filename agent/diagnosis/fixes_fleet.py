"""Fixes for fleet incidents: replicas of one model that the router loads unevenly."""

from __future__ import annotations

from collections.abc import Mapping

from vllm_sentinel.agent.diagnosis.fix_inputs import cannot_compute, evidence_value, readable, signals
from vllm_sentinel.agent.diagnosis.fix_registry import Fix, register_fix
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

SUGGESTED_POLICY = "least-loaded (queue-depth) routing, or prefix-aware routing bounded by load"
ROUTERS = ("vLLM production-stack's router: --routing-logic kvaware or prefixaware instead of roundrobin or "
           "session; llm-d's inference scheduler: its endpoint picker scores each replica's queue depth and "
           "prefix-cache hits per request")


@register_fix("load_imbalance", "load_imbalance.router")
def load_imbalance_router(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Route by load: the queue of one replica fits in the free sequence slots of the idle ones."""
    param = "router policy"
    (waiting, running, idle, idle_running), absent = signals(evidence, "waiting", "running", "idle_replicas",
                                                             "idle_running")
    if absent:
        return cannot_compute(param, None, cfg, [], "where the queue would fit", absent)
    replicas = evidence_value(evidence, "replicas")
    rate, fleet_rate = evidence_value(evidence, "request_rate"), evidence_value(evidence, "fleet_request_rate")
    cap = cfg.get("max_num_seqs")
    cap_how = f"--max-num-seqs {cap}" if cap is not None else f"the {readable(running)} it runs at its cap"
    per_slot = (cap if cap is not None else running) - idle_running
    free = max(0.0, idle * per_slot)
    current = "requests spread without regard to load"
    if rate is not None and fleet_rate and replicas:
        current = (f"{rate / fleet_rate:.0%} of the model's requests to this replica "
                   f"(an even share is {1 / replicas:.0%})")
    queue = evidence_value(evidence, "queue_time_p95_seconds")
    why = (f"{readable(waiting)} requests wait here" + (f" ({readable(queue)} s queue-time p95)" if queue else "")
           + f" while {readable(idle)} of {readable(replicas or idle + 1)} replicas run {readable(idle_running)} on "
           f"average with nothing waiting: {readable(round(free))} free sequence slots there ({readable(idle)} x "
           f"({cap_how} - {readable(idle_running)})) would take the whole queue"
           f"{'' if free >= waiting else ' in part'}, without another replica. {ROUTERS}")
    return Fix(param, current, SUGGESTED_POLICY, why)
