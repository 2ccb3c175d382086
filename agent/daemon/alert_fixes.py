"""The fix an Alertmanager alert leads with: the incident's fixes ranked by the what-if model, as diagnose ranks them.

Ranking replays the incident's stretch of history through the model (a fraction of a second to a few
seconds on a busy host), so the notifier does it on its own thread, once per incident, and only where
the CPU budget allows; an alert never waits for it: it goes out unranked and says so.
"""

from __future__ import annotations

from typing import Any

from vllm_sentinel.agent.diagnosis.fix_ranking import Objectives, rank_fixes
from vllm_sentinel.agent.diagnosis.incident_record import Incident
from vllm_sentinel.agent.diagnosis.whatif import store_configs
from vllm_sentinel.agent.promql.engine import Engine

# (the fixes in the model's order, the incident's model block: calibration error or why it was withheld)
RankedFixes = tuple[list[dict], dict]


def rank_for_alert(reader: Any, inc: Incident, now_ms: int, objectives: Objectives) -> RankedFixes:
    """The incident's fixes predicted and ordered by goodput under the objectives, read from `reader` (a store)."""
    doc = inc.as_dict()
    doc["fixes"] = [dict(f) for f in inc.fixes]
    rank_fixes(Engine(reader), lambda s, e: store_configs(reader, s, e), [doc], now_ms, objectives)
    return doc["fixes"], doc.get("model") or {}


def fix_annotations(fixes: list[dict], model: dict | None, unranked_why: str = "") -> dict[str, str]:
    """`fix` (the first fix with a suggested value), and where the model ranked it its prediction, trade and error."""
    fix = next((f for f in fixes if f.get("suggested") not in (None, "")), None)
    if fix is None:
        return {}
    current = fix.get("current")
    out = {"fix": (f"{fix.get('param')} {current} -> {fix.get('suggested')}" if current not in (None, "")
                   else f"{fix.get('param')} {fix.get('suggested')}")}
    if model is None:
        if unranked_why:
            out["fix_ranking"] = f"not ranked: {unranked_why}"
        return out
    if model.get("withheld"):
        out["fix_ranking"] = f"in the rule's order: the model withheld its predictions ({model['withheld']})"
        return out
    predicted = fix.get("predicted")
    if predicted is None:
        out["fix_ranking"] = "in the rule's order: the model cannot represent this fix"
        return out
    errors = [e for e in (model.get("calibration_error") or {}).values() if e is not None]
    out["fix_ranking"] = (f"ranked {fix.get('rank')} of {sum(1 for f in fixes if f.get('rank'))} by predicted goodput "
                          f"under the SLO (model error up to {max(errors, default=0.0):.0%} on this incident's history)")
    out["fix_predicted"] = _prediction(predicted)
    if predicted.get("trade"):
        out["fix_trade"] = str(predicted["trade"])
    return out


def _prediction(p: dict) -> str:
    parts = [("TTFT p95", p.get("ttft_p95_s"), "{:.3g} s"), ("goodput", p.get("goodput_rps"), "{:.3g} req/s"),
             ("tokens/s", p.get("throughput_tps"), "{:,.0f}"), ("preemptions/s", p.get("preemptions_per_s"), "{:.3g}")]
    return ", ".join(f"{name} {fmt.format(v)}" for name, v, fmt in parts if v is not None)
