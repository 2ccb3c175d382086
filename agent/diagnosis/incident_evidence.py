"""An incident's evidence: each evidence signal of its rule read at a time, the sample belonging to its alert."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from vllm_sentinel.agent.alerts.rulemodel import Rule
from vllm_sentinel.agent.alerts.state import to_vector

# the logger keeps the name it had before incidents.py was split: log filters and readers know it by that
log = logging.getLogger("vllm_sentinel.agent.diagnosis.incidents")


def _matches(sample_labels: Mapping[str, str], alert_labels: Mapping[str, str]) -> int:
    """How many labels a sample shares with the alert, or -1 when one of them disagrees."""
    shared = 0
    for k, v in sample_labels.items():
        if k == "__name__":
            continue
        if k in alert_labels:
            if alert_labels[k] != v:
                return -1
            shared += 1
    return shared


def pick_for_alert(vector: list[tuple[dict[str, str], float]], labels: Mapping[str, str]) -> float | None:
    """The sample of an evidence result that belongs to an alert: the one agreeing with the alert's
    labels and sharing most of them ({instance: a} picks the series of instance a)."""
    best, best_score = None, -1
    for sl, v in vector:
        score = _matches(sl, labels)
        if score > best_score:
            best, best_score = v, score
    return best


def evidence_values(rule: Rule, query: Callable[[str, int], Any], t_ms: int,
                    labels: Mapping[str, str]) -> list[dict]:
    """Each evidence signal of `rule` evaluated at `t_ms` for the alert with `labels`."""
    out = []
    for ev in rule.evidence:
        try:
            value = pick_for_alert(to_vector(query(ev.expr, t_ms)), labels)
        except Exception as e:  # an evidence query that fails is shown as missing, with why
            log.warning("evidence %s of %s failed: %s", ev.signal, rule.name, e)
            value = None
        # the expression travels with the value, so a report can chart it after the rule file changed
        out.append({"signal": ev.signal, "value": json_float(value), "threshold": ev.threshold, "unit": ev.unit,
                    "expr": ev.expr})
    return out


def json_float(v: float | None) -> float | None:
    """The value, or None where JSON has no number for it (NaN, infinities)."""
    if v is None or v != v or v in (float("inf"), float("-inf")):
        return None  # JSON has no NaN/Inf
    return v
