"""What incidents are evaluated from: a pack's alerting rules, and the hook giving an instance's configuration."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleFile, RuleGroup

ConfigFor = Callable[[str | None], Mapping[str, Any]]


def no_config(_instance: str | None) -> Mapping[str, Any]:
    """The configuration hook when none is given: every instance's configuration is empty."""
    return {}


def alerting_rules(groups: list[RuleGroup]) -> list[Rule]:
    """The alerting rules of the groups, in order (recording rules left out)."""
    return [r for g in groups for r in g.rules if r.is_alert]


def groups_of(rules: list[RuleFile] | list[RuleGroup]) -> list[RuleGroup]:
    """The rule groups of rule files (or of groups, as they are)."""
    out: list[RuleGroup] = []
    for x in rules:
        out.extend(x.groups if isinstance(x, RuleFile) else [x])
    return out
