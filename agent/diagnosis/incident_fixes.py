"""An alerting rule's fix items for an incident: filled from the live configuration and the evidence values,
by the fix functions registered with register_fix (agent/diagnosis/fixes.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from vllm_sentinel.agent.alerts.rulemodel import Rule
from vllm_sentinel.agent.diagnosis.fix_registry import as_live_config
from vllm_sentinel.agent.diagnosis.fixes import FIXES
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

# the logger keeps the name it had before incidents.py was split: log filters and readers know it by that
log = logging.getLogger("vllm_sentinel.agent.diagnosis.incidents")


def compute_fixes(rule: Rule, config: Mapping[str, Any], evidence: Mapping[str, float | None],
                  labels: Mapping[str, str]) -> list[dict]:
    """The rule's fix items, filled from `config` and the evidence values."""
    out = []
    for f in rule.fix:
        name = f.param.lstrip("-").replace("-", "_")
        current = config.get(name)
        item = {"param": f.param, "current": None if current is None else str(current),
                "suggested": f.suggest, "why": f.why}
        if f.compute:
            fn = FIXES.get(f.compute)
            if fn is None:
                item["why"] = f"fix function {f.compute!r} is not registered (see incidents.register_fix)"
            else:
                try:
                    computed = fn(as_live_config(config, labels.get("instance", "")), evidence)
                except Exception as e:  # a broken fix function must not stop incident tracking
                    log.warning("fix function %s failed: %s", f.compute, e)
                    item["why"] = f"fix function {f.compute!r} failed: {e}"
                else:
                    if computed is None:
                        continue
                    item.update(current=computed.current, suggested=computed.suggested, why=computed.why)
        source = _current_source(config, name, item["current"])
        if source:
            item["current_source"] = source  # where the current value came from: flag, engine, or inferred
        out.append(item)
    return out


def _current_source(config: Mapping[str, Any], name: str, current: str | None) -> str | None:
    """The configuration's source of `name` when the fix's current value is that configuration value."""
    if current is None or not isinstance(config, LiveConfig) or not config.known(name):
        return None
    return config.source(name) if str(config.get(name)) == current else None
