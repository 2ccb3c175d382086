"""What a rule file holds once loaded: groups of alerting and recording rules, with evidence and fix items."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


class RuleFileError(ValueError):
    """One or more problems in rule files; `problems` holds one 'file:line:col: message' each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))



@dataclass
class Evidence:
    """A named signal that proves an incident: a PromQL expression, its unit and threshold."""

    signal: str
    expr: str
    threshold: float | None = None
    unit: str = ""
    description: str = ""


@dataclass
class RuleFix:
    """A parameter suggestion; `compute` names a registered function that fills in the values."""

    param: str
    suggest: str | None = None
    compute: str | None = None
    why: str | None = None


@dataclass
class Explains:
    """A causal link, as Alertmanager's inhibit_rules: this rule's incident explains `incidents`
    of the same episode whose labels in `equal` have the same values (absent on both counts as equal)."""

    incidents: list[str]
    equal: list[str] = field(default_factory=list)


@dataclass
class Rule:
    """One alerting or recording rule, with where it was written."""

    name: str
    kind: str  # "alert" | "record"
    expr: str
    for_ms: int = 0
    keep_firing_for_ms: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    description: str = ""
    references: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    fix: list[RuleFix] = field(default_factory=list)
    explains: list[Explains] = field(default_factory=list)
    group: str = ""
    file: str = ""
    line: int = 0

    @property
    def is_alert(self) -> bool:
        """True for alerting rules."""
        return self.kind == "alert"

    @property
    def incident(self) -> str | None:
        """The canonical incident id this rule raises (its `incident` label)."""
        return self.labels.get("incident")

    @property
    def severity(self) -> str | None:
        """The rule's `severity` label."""
        return self.labels.get("severity")

    @property
    def where(self) -> str:
        """'file:line' of the rule, for messages."""
        return f"{self.file}:{self.line}"


@dataclass
class RuleGroup:
    """A group of rules evaluated in order at one interval."""

    name: str
    rules: list[Rule]
    interval_ms: int | None = None
    limit: int = 0
    file: str = ""
    line: int = 0


@dataclass
class RuleFile:
    """A parsed rule file."""

    path: str
    groups: list[RuleGroup]
    params: dict[str, str] = field(default_factory=dict)  # effective values, as substituted

    @property
    def rules(self) -> list[Rule]:
        """Every rule of every group, in file order."""
        return [r for g in self.groups for r in g.rules]


_NOT_BEHAVIOUR = ("file", "line", "description", "references")  # where a rule is written, and prose about it


def fingerprint(groups: list[RuleGroup]) -> str:
    """A short hash of what the groups evaluate and record (names, expressions, for, labels, annotations,
    evidence, fixes), not of where they are written: two loads of the same pack agree, an edit differs."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in _NOT_BEHAVIOUR}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    text = json.dumps([strip(asdict(g)) for g in groups], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
