"""The one registry of fix computations: a rule file's `fix: [{compute: NAME}]` names one of them.

A computation gets the live configuration of the incident's instance and the evidence values by
signal name, and returns a Fix (a concrete parameter change with its arithmetic, or the missing
inputs named) or None when the parameter is not the lever here. The computations themselves are
in agent/diagnosis/fixes_memory.py and fixes_scheduling.py; agent/diagnosis/fixes.py loads them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig


@dataclass
class Fix:
    """A parameter change: current -> suggested, with the arithmetic; `missing` lists unknown inputs."""

    param: str
    current: str | None
    suggested: str | None
    why: str
    missing: list[str] = field(default_factory=list)

    @property
    def concrete(self) -> bool:
        """True when it carries a suggested value."""
        return self.suggested is not None

    def as_dict(self) -> dict[str, str | None]:
        """The shape of a fix in `diagnose --format json`."""
        return {"param": self.param, "current": self.current, "suggested": self.suggested, "why": self.why}


FixFn = Callable[[LiveConfig, Mapping[str, float | None]], "Fix | None"]
FIXES: dict[str, FixFn] = {}


def register_fix(*names: str) -> Callable[[FixFn], FixFn]:
    """Register a fix computation under each of `names` (the rule files' `compute:` values)."""
    def deco(fn: FixFn) -> FixFn:
        for name in names:
            FIXES[name] = fn
        return fn
    return deco


def as_live_config(values: Mapping[str, Any], instance: str = "") -> LiveConfig:
    """A LiveConfig from a plain mapping of values (sources: 'configuration snapshot')."""
    if isinstance(values, LiveConfig):
        return values
    return LiveConfig(instance, dict(values), {k: "configuration snapshot" for k, v in values.items() if v is not None})
