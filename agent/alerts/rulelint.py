"""vllm-sentinel's conventions for rule files, beyond the schema: `rules check`'s lint."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel.agent.alerts.rulefile import rule_test_path
from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleFile


def lint_rules(files: list[RuleFile], known_fixes: set[str] | None = None) -> list[str]:
    """vllm-sentinel's conventions beyond the schema, one 'file:line: problem' each.

    Alert names are unique, an alerting rule has `incident` and `severity` labels and a
    `summary` annotation, every rule file has its test file in tests/, and fix `compute` names
    are registered (when `known_fixes` is given), and every incident an `explains` item names is
    raised by some rule (a typo would link nothing).
    """
    problems: list[str] = []
    raised = {r.incident for rf in files for r in rf.rules if r.is_alert and r.incident}
    first_seen: dict[str, Rule] = {}
    for rf in files:
        test = rule_test_path(Path(rf.path))
        if not test.is_file():
            problems.append(f"{rf.path}: no test file; write {test} (promtool's format, a boundary pair "
                            "either side of `for`)")
        for r in rf.rules:
            if not r.is_alert:
                continue
            if r.name in first_seen:
                problems.append(f"{r.where}: alert name {r.name} is already used at {first_seen[r.name].where}")
            else:
                first_seen[r.name] = r
            for label in ("incident", "severity"):
                if not r.labels.get(label):
                    problems.append(f"{r.where}: alert {r.name} has no {label!r} label "
                                    f"(labels: {{incident: <an incident id>, severity: ...}})")
            if not r.annotations.get("summary"):
                problems.append(f"{r.where}: alert {r.name} has no 'summary' annotation (one sentence a person can act on)")
            if r.description and "description" in r.annotations:
                problems.append(f"{r.where}: alert {r.name} has both a `description` key and a `description` "
                                "annotation; keep one")
            for item in r.explains:
                for name in item.incidents:
                    if name not in raised:
                        problems.append(f"{r.where}: alert {r.name} explains {name!r}, which no rule raises "
                                        f"(incidents: {', '.join(sorted(raised))})")
            if known_fixes is not None:
                for f in r.fix:
                    if f.compute and f.compute not in known_fixes:
                        problems.append(f"{r.where}: alert {r.name}: fix {f.param} uses compute {f.compute!r}, "
                                        f"which is not registered (known: {', '.join(sorted(known_fixes)) or 'none'})")
    return problems
