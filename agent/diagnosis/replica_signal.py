"""The autoscaling signal: how many replicas of each model the firing incidents ask for, and why.

The daemon exports it as `vllm_sentinel_desired_replicas{model_name, reason}` for KEDA or an HPA.
The number is the replica fix's own arithmetic (`queue_blocking.replicas` in fixes_scheduling.py:
running + waiting, each the peak over the rule's window, divided by the sequences one replica holds),
run on the evidence of each open incident that more replicas relieve:

* `queue`: queue_blocking, traffic_burst (requests wait for a sequence slot);
* `kv_pressure`: kv_cache_pressure (the KV cache holds fewer sequences than are asked for);
* `ttft_slo`: ttft_slo_breach (time to first token above the objective).

The largest need per model wins (ties in that order). A model nothing asks more for gets the
replicas that serve it now, with reason `none`: never 0, so an autoscaler reading it holds steady.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.alerts.state import to_vector
from vllm_sentinel.agent.diagnosis.fix_registry import as_live_config
from vllm_sentinel.agent.diagnosis.fixes import FIXES

# incident -> reason, in the order a tie is resolved
REASONS: dict[str, str] = {"queue_blocking": "queue", "traffic_burst": "queue",
                           "kv_cache_pressure": "kv_pressure", "ttft_slo_breach": "ttft_slo"}
REASON_NONE = "none"
REPLICA_FIX = "queue_blocking.replicas"
# the replicas of each model the store saw lately (the rules' `replicas` evidence)
CURRENT_REPLICAS = ("count by (model_name) (group by (model_name, instance) "
                    "(last_over_time(vllm:num_requests_running[5m])))")


@dataclass(frozen=True)
class ReplicaNeed:
    """The replicas one model needs, why, and the incident that asks (None for reason 'none')."""

    model_name: str
    replicas: int
    reason: str
    incident_id: str | None = None
    why: str = ""


def current_replicas(instant: Callable[[str, int], Any], t_ms: int) -> dict[str, int]:
    """Replicas per model at `t_ms`: instances with vllm:num_requests_running in the last 5 minutes."""
    out: dict[str, int] = {}
    for labels, value in to_vector(instant(CURRENT_REPLICAS, t_ms)):
        model = labels.get("model_name")
        if model and value == value:
            out[model] = int(value)
    return out


def _need_of(incident: Any, current: Mapping[str, int], config_for: Callable[[str | None], Mapping[str, Any]]
             ) -> ReplicaNeed | None:
    """What one open incident asks for, by the replica fix's arithmetic; None when it asks for nothing."""
    labels = incident.labels
    reason, model = REASONS.get(labels.get("incident", "")), labels.get("model_name")
    if reason is None or not model:
        return None
    evidence = {e["signal"]: e["value"] for e in incident.evidence}
    if evidence.get("replicas") is None and model in current:
        evidence["replicas"] = float(current[model])  # rules without a `replicas` signal (kv_cache_pressure)
    instance = labels.get("instance")
    fix = FIXES[REPLICA_FIX](as_live_config(config_for(instance), instance or ""), evidence)
    if fix is None or fix.suggested is None:
        return None  # another lever comes first (more sequences fit), or an input is missing
    return ReplicaNeed(model, int(fix.suggested), reason, incident.id, fix.why)


def desired_replicas(incidents: Iterable[Any], current: Mapping[str, int],
                     config_for: Callable[[str | None], Mapping[str, Any]]) -> dict[str, ReplicaNeed]:
    """model_name -> the largest need of its open incidents, else its current replicas (at least 1).

    `incidents` are the live evaluator's open incidents (labels, evidence, id).
    {'m': 2 replicas now} + a queue_blocking of m asking 5 -> {'m': ReplicaNeed('m', 5, 'queue', ...)}
    """
    rank = list(dict.fromkeys(REASONS.values()))
    out = {m: ReplicaNeed(m, max(1, n), REASON_NONE) for m, n in current.items()}
    for inc in incidents:
        need = _need_of(inc, current, config_for)
        if need is None:
            continue
        have = out.get(need.model_name)
        if have is None or need.replicas > have.replicas or (
                need.replicas == have.replicas and have.reason != REASON_NONE
                and rank.index(need.reason) < rank.index(have.reason)):
            out[need.model_name] = need  # a need equal to the replicas serving now is no need: 'none' stays
    return out
