"""Export rule files for a fleet's Prometheus: plain rule files plus their tests, rewritten.

Our keys (`description`, `references`, `evidence`, `fix`) become annotations holding strings
(references one per line, evidence and fix as compact JSON), so `promtool check rules` accepts
the files and a ruler keeps the information. Because promtool compares every annotation of a
firing alert, the exported tests get the same annotations added to their expected alerts, and
their `rule_files` point at the exported rules: `promtool test rules` then passes on them. The
causal links (`explains`) and the `episode_test` cases that check them mean nothing to a
Prometheus: they are left out.
"""

from __future__ import annotations

import copy
import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vllm_sentinel.agent.alerts.rulefile import load_rule_file, load_rule_files
from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleFile
from vllm_sentinel.agent.alerts.ruleparams import ParamValues
from vllm_sentinel.collectors.timefmt import format_prometheus_duration_ms


class ExportError(ValueError):
    """A rule or test file that cannot be exported faithfully; the message says which and why."""


@dataclass
class ExportResult:
    """What `export_rules` wrote."""

    rule_files: list[Path] = field(default_factory=list)
    test_files: list[Path] = field(default_factory=list)


def _escape_template(text: str) -> str:
    # annotations are Go templates: a literal "{{" must not start an action
    return text.replace("{{", '{{ "{{" }}')


def extra_annotations(rule: Rule) -> dict[str, str]:
    """Our keys of an alerting rule as annotation strings (what Prometheus will show, expanded)."""
    out: dict[str, str] = {}
    if rule.description and "description" not in rule.annotations:
        out["description"] = rule.description
    if rule.references:
        out["references"] = "\n".join(rule.references)
    if rule.evidence:
        out["evidence"] = json.dumps([{k: v for k, v in vars(e).items() if v not in (None, "")}
                                      for e in rule.evidence], separators=(", ", ": "))
    if rule.fix:
        out["fix"] = json.dumps([{k: v for k, v in vars(f).items() if v is not None} for f in rule.fix],
                                separators=(", ", ": "))
    clash = sorted(k for k in out if k in rule.annotations)
    if clash:
        raise ExportError(f"{rule.where}: rule {rule.name} has annotation(s) {', '.join(clash)} and the key(s) "
                          "of the same name; rename the annotation")
    return out


def prometheus_rule(rule: Rule) -> dict[str, Any]:
    """One rule as Prometheus' rule format (a dict ready for YAML)."""
    d: dict[str, Any] = {rule.kind: rule.name, "expr": rule.expr}
    if rule.for_ms:
        d["for"] = format_prometheus_duration_ms(rule.for_ms)
    if rule.keep_firing_for_ms:
        d["keep_firing_for"] = format_prometheus_duration_ms(rule.keep_firing_for_ms)
    if rule.labels:
        d["labels"] = dict(rule.labels)
    if rule.is_alert:
        annotations = dict(rule.annotations)
        annotations.update({k: _escape_template(v) for k, v in extra_annotations(rule).items()})
        if annotations:
            d["annotations"] = annotations
    return d


def prometheus_rule_file(rf: RuleFile) -> dict[str, Any]:
    """A whole rule file in Prometheus' format."""
    groups = []
    for g in rf.groups:
        gd: dict[str, Any] = {"name": g.name}
        if g.interval_ms is not None:
            gd["interval"] = format_prometheus_duration_ms(g.interval_ms)
        if g.limit:
            gd["limit"] = g.limit
        gd["rules"] = [prometheus_rule(r) for r in g.rules]
        groups.append(gd)
    return {"groups": groups}


class _Dumper(yaml.SafeDumper):
    pass


def _str_repr(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    style = "|" if "\n" in s and not any(c in s for c in "\t\r") and s == s.strip(" ") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _str_repr)


def dump_yaml(data: Any) -> str:
    """YAML as a person would write it: key order kept, multi-line strings as blocks."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)


def export_rules(rule_paths: list[Path], test_paths: list[Path], out_dir: Path,
                 params: ParamValues | None = None) -> ExportResult:
    """Write `out_dir/<name>.yaml` per rule file and `out_dir/tests/<test name>` per test file.

    Parameters are written substituted (defaults, or `params` overrides), so the files are plain
    Prometheus rules; an override name no rule file declares is a RuleFileError.
    """
    if params:
        load_rule_files(list(rule_paths), params)  # rejects unknown override names up front
    result = ExportResult()
    out_dir.mkdir(parents=True, exist_ok=True)
    exported: dict[Path, Path] = {}
    rules_by_alert: dict[str, list[Rule]] = {}
    for path in rule_paths:
        rf = load_rule_file(path, params)
        target = out_dir / Path(path).name
        if target in exported.values():
            raise ExportError(f"{path}: another rule file is also named {target.name}; names must be unique to export")
        target.write_text(_HEADER.format(source=Path(path).name) + dump_yaml(prometheus_rule_file(rf)))
        exported[Path(path).resolve()] = target
        result.rule_files.append(target)
        for r in rf.rules:
            if r.is_alert:
                rules_by_alert.setdefault(r.name, []).append(r)
    if test_paths:
        (out_dir / "tests").mkdir(exist_ok=True)
    for tpath in test_paths:
        target = out_dir / "tests" / Path(tpath).name
        target.write_text(_HEADER.format(source=Path(tpath).name)
                          + dump_yaml(export_test(Path(tpath), target, exported, rules_by_alert)))
        result.test_files.append(target)
    return result


_HEADER = "# Exported by `vllm-sentinel rules export` from {source}; edit the source, not this file.\n"


def export_test(path: Path, target: Path, exported: dict[Path, Path], rules_by_alert: dict[str, list[Rule]]) -> dict:
    """A test file rewritten for the exported rules: new rule_files, extra annotations expected."""
    data = yaml.safe_load(path.read_text()) or {}
    data = copy.deepcopy(data)
    new_files = []
    for pattern in data.get("rule_files") or []:
        full = pattern if Path(pattern).is_absolute() else str(path.parent / pattern)
        matches = sorted(glob.glob(full))
        if not matches:
            raise ExportError(f"{path}: rule_files entry {pattern!r} matches no file")
        for m in matches:
            dest = exported.get(Path(m).resolve())
            if dest is None:
                raise ExportError(f"{path}: uses {m}, which is not among the exported rule files; export it too")
            new_files.append(_relative(dest, target.parent))
    data["rule_files"] = new_files
    data["tests"] = [g for g in (_without_episode_cases(g) for g in data.get("tests") or []) if g is not None]
    for group in data.get("tests") or []:
        for case in (group or {}).get("alert_rule_test") or []:
            rules = rules_by_alert.get(case.get("alertname"), [])
            extras = [extra_annotations(r) for r in rules]
            if not any(extras):
                continue
            if any(e != extras[0] for e in extras):
                raise ExportError(f"{path}: alert {case.get('alertname')} is defined by several rules with different "
                                  "evidence/fix/description; give them distinct names to export the test")
            for exp in case.get("exp_alerts") or []:
                ann = exp.get("exp_annotations") or {}
                exp["exp_annotations"] = {**ann, **extras[0]}
    return data


def _without_episode_cases(group: Any) -> Any:
    """A test group without its episode_test cases (promtool refuses the key); None when nothing is left."""
    if not isinstance(group, dict) or "episode_test" not in group:
        return group
    rest = {k: v for k, v in group.items() if k != "episode_test"}
    return rest if rest.get("alert_rule_test") or rest.get("promql_expr_test") else None


def _relative(dest: Path, start: Path) -> str:
    return os.path.relpath(dest.resolve(), start.resolve())
