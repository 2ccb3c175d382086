"""The rule-file schema: a walk over composed YAML nodes that builds rules and reports every problem at file:line:col.

An unknown key names the keys allowed there, so a typo (`anotations:`) fails loudly instead of
dropping a summary. Alert labels and annotations are parsed as templates here, so a broken
template fails at load time, not at the first firing.
"""

from __future__ import annotations

import re
from typing import Any

import promql_parser
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vllm_sentinel.agent.alerts.rulemodel import Evidence, Explains, Rule, RuleFix, RuleGroup
from vllm_sentinel.agent.alerts.template_functions import TemplateError
from vllm_sentinel.agent.alerts.templating import check_template
from vllm_sentinel.collectors.timefmt import parse_prometheus_duration_ms

TOP_KEYS = ("groups", "params")
GROUP_KEYS = ("name", "interval", "limit", "rules")
PROMETHEUS_RULE_KEYS = ("record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations")
EXTRA_RULE_KEYS = ("description", "references", "evidence", "fix", "explains")
RULE_KEYS = PROMETHEUS_RULE_KEYS + EXTRA_RULE_KEYS
EVIDENCE_KEYS = ("signal", "expr", "threshold", "unit", "description")
FIX_KEYS = ("param", "suggest", "compute", "why")
EXPLAINS_KEYS = ("incidents", "equal")

_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_INCIDENT_RE = _LABEL_NAME_RE  # incident ids are words: queue_blocking, gpu_fault


class SchemaLoader:
    """Walks composed YAML nodes so every message carries a line number."""

    def __init__(self, path: str):
        self.path = path
        self.problems: list[str] = []
        self._constructor = yaml.SafeLoader("")

    def err(self, node: Node | None, msg: str) -> None:
        if node is None:
            self.problems.append(f"{self.path}: {msg}")
        else:
            m = node.start_mark
            self.problems.append(f"{self.path}:{m.line + 1}:{m.column + 1}: {msg}")

    def mapping(self, node: Node, allowed: tuple[str, ...], what: str) -> dict[str, tuple[Node, Node]]:
        """Keys of a mapping node -> (key node, value node); unknown or repeated keys are problems."""
        if not isinstance(node, MappingNode):
            self.err(node, f"{what} must be a mapping with keys {', '.join(allowed)}")
            return {}
        out: dict[str, tuple[Node, Node]] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, ScalarNode) else None
            if key not in allowed:
                self.err(k, f"unknown key {key!r} in {what}; allowed keys: {', '.join(allowed)}")
                continue
            if key in out:
                first = out[key][0].start_mark.line + 1
                self.err(k, f"key {key!r} repeated in {what} (first at line {first})")
                continue
            out[key] = (k, v)
        return out

    def scalar(self, node: Node, what: str) -> Any:
        if not isinstance(node, ScalarNode):
            self.err(node, f"{what} must be a single value, not a {'list' if isinstance(node, SequenceNode) else 'mapping'}")
            return None
        return self._constructor.construct_object(node, deep=True)

    def string(self, node: Node, what: str, required: bool = False) -> str | None:
        if not isinstance(node, ScalarNode) or node.tag.endswith(":null"):
            if required or not isinstance(node, ScalarNode):
                self.err(node, f"{what} must be a string")
            return None
        return node.value  # Go reads any scalar into a string field as written

    def string_map(self, node: Node, what: str, name_re: re.Pattern, kind: str) -> dict[str, str]:
        if isinstance(node, ScalarNode) and node.tag.endswith(":null"):
            return {}
        if not isinstance(node, MappingNode):
            self.err(node, f"{what} must be a mapping of {kind} names to strings")
            return {}
        out: dict[str, str] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, ScalarNode) else ""
            if not name_re.match(key) or key == "__name__" and kind == "label":
                self.err(k, f"invalid {kind} name: {key}")
            if key in out:
                self.err(k, f"{kind} {key!r} repeated in {what}")
            val = self.string(v, f"{kind} {key!r}", required=True)
            out[key] = "" if val is None else val
        return out

    def duration(self, node: Node, what: str) -> int:
        val = self.scalar(node, what)
        if val is None:
            return 0
        try:
            return parse_prometheus_duration_ms(str(val))
        except ValueError as e:
            self.err(node, f"{what}: {e}")
            return 0

    def sequence(self, node: Node, what: str) -> list[Node]:
        if isinstance(node, ScalarNode) and node.tag.endswith(":null"):
            return []
        if not isinstance(node, SequenceNode):
            self.err(node, f"{what} must be a list")
            return []
        return list(node.value)

    # -- the schema ------------------------------------------------------------------------------
    def file(self, root: Node | None) -> list[RuleGroup]:
        if root is None:
            return []
        top = self.mapping(root, TOP_KEYS, "the rule file")
        groups: list[RuleGroup] = []
        seen: set[str] = set()
        for gnode in self.sequence(top["groups"][1], "groups") if "groups" in top else []:
            g = self.group(gnode)
            if g is None:
                continue
            if g.name in seen:
                self.err(gnode, f'groupname: "{g.name}" is repeated in the same file')
            seen.add(g.name)
            groups.append(g)
        return groups

    def group(self, node: Node) -> RuleGroup | None:
        keys = self.mapping(node, GROUP_KEYS, "a group")
        if not isinstance(node, MappingNode):
            return None
        name = self.string(keys["name"][1], "group name") if "name" in keys else None
        if not name:
            self.err(node, "Groupname must not be empty")
            name = ""
        interval = self.duration(keys["interval"][1], "interval") if "interval" in keys else None
        limit = 0
        if "limit" in keys:
            limit = self.scalar(keys["limit"][1], "limit")
            if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
                self.err(keys["limit"][1], "limit must be a non-negative integer")
                limit = 0
        rules = [r for i, rn in enumerate(self.sequence(keys["rules"][1], "rules") if "rules" in keys else [])
                 if (r := self.rule(rn, name, i + 1)) is not None]
        return RuleGroup(name, rules, interval, limit, self.path, node.start_mark.line + 1)

    def rule(self, node: Node, group: str, index: int) -> Rule | None:
        keys = self.mapping(node, RULE_KEYS, f'rule {index} of group "{group}"')
        if not isinstance(node, MappingNode):
            return None
        get = lambda k: keys[k][1] if k in keys else None  # noqa: E731
        alert = self.string(get("alert"), "alert") if "alert" in keys else None
        record = self.string(get("record"), "record") if "record" in keys else None
        where = f'group "{group}", rule {index}, "{alert or record or ""}"'
        if alert and record:
            self.err(get("record"), f"{where}: only one of 'record' and 'alert' must be set")
        if not alert and not record:
            self.err(node, f"{where}: one of 'record' or 'alert' must be set")
            return None
        kind = "alert" if alert else "record"
        expr = self.string(get("expr"), "expr") if "expr" in keys else None
        if not expr:
            self.err(get("expr") or node, f"{where}: field 'expr' must be set in rule")
            expr = ""
        else:
            try:
                promql_parser.parse(expr)
            except (ValueError, TypeError) as e:
                self.err(get("expr"), f"{where}: could not parse expression: {e}")
        rule = Rule(name=alert or record or "", kind=kind, expr=expr, group=group, file=self.path,
                    line=node.start_mark.line + 1)
        if "for" in keys:
            rule.for_ms = self.duration(get("for"), f"{where}: for")
        if "keep_firing_for" in keys:
            rule.keep_firing_for_ms = self.duration(get("keep_firing_for"), f"{where}: keep_firing_for")
        if "labels" in keys:
            rule.labels = self.string_map(get("labels"), "labels", _LABEL_NAME_RE, "label")
        if "annotations" in keys:
            rule.annotations = self.string_map(get("annotations"), "annotations", _LABEL_NAME_RE, "annotation")
        if "description" in keys:
            rule.description = self.string(get("description"), "description", required=True) or ""
        if "references" in keys:
            rule.references = [s for n in self.sequence(get("references"), "references")
                               if (s := self.string(n, "a reference", required=True))]
        if "evidence" in keys:
            rule.evidence = [e for n in self.sequence(get("evidence"), "evidence") if (e := self.evidence(n, where))]
        if "fix" in keys:
            rule.fix = [f for n in self.sequence(get("fix"), "fix") if (f := self.fix(n, where))]
        if "explains" in keys and kind == "alert":
            rule.explains = [x for n in self.sequence(get("explains"), "explains")
                             if (x := self.explains(n, where, rule.incident))]
        if kind == "record":
            for bad in ("annotations", "for", "keep_firing_for", *EXTRA_RULE_KEYS):
                if bad in keys:
                    self.err(keys[bad][0], f"{where}: invalid field '{bad}' in recording rule")
            if not _METRIC_NAME_RE.match(rule.name):
                self.err(get("record"), f"{where}: invalid recording rule name: {rule.name}")
        else:
            for what, mapping in (("label", rule.labels), ("annotation", rule.annotations)):
                for k, text in mapping.items():
                    try:
                        check_template(text, rule.name)
                    except TemplateError as e:
                        self.err(keys["labels" if what == "label" else "annotations"][1],
                                 f"{where}: {what} {k!r}: {e}")
        return rule

    def evidence(self, node: Node, where: str) -> Evidence | None:
        keys = self.mapping(node, EVIDENCE_KEYS, "an evidence item")
        if not isinstance(node, MappingNode):
            return None
        signal = self.string(keys["signal"][1], "signal", True) if "signal" in keys else None
        expr = self.string(keys["expr"][1], "expr", True) if "expr" in keys else None
        if not signal or not expr:
            self.err(node, f"{where}: an evidence item needs 'signal' (a name) and 'expr' (PromQL)")
            return None
        try:
            promql_parser.parse(expr)
        except (ValueError, TypeError) as e:
            self.err(keys["expr"][1], f"{where}: evidence {signal!r}: could not parse expression: {e}")
        threshold = None
        if "threshold" in keys:
            threshold = self.scalar(keys["threshold"][1], "threshold")
            if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
                self.err(keys["threshold"][1], f"{where}: evidence {signal!r}: threshold must be a number")
                threshold = None
            else:
                threshold = float(threshold)
        unit = self.string(keys["unit"][1], "unit") or "" if "unit" in keys else ""
        desc = self.string(keys["description"][1], "description") or "" if "description" in keys else ""
        return Evidence(signal, expr, threshold, unit, desc)

    def fix(self, node: Node, where: str) -> RuleFix | None:
        keys = self.mapping(node, FIX_KEYS, "a fix item")
        if not isinstance(node, MappingNode):
            return None
        param = self.string(keys["param"][1], "param", True) if "param" in keys else None
        if not param:
            self.err(node, f"{where}: a fix item needs 'param' (the engine flag, e.g. --max-num-seqs)")
            return None
        vals = {k: self.string(keys[k][1], k) if k in keys else None for k in ("suggest", "compute", "why")}
        return RuleFix(param, vals["suggest"], vals["compute"], vals["why"])

    def explains(self, node: Node, where: str, incident: str | None) -> Explains | None:
        keys = self.mapping(node, EXPLAINS_KEYS, "an explains item")
        if not isinstance(node, MappingNode):
            return None
        if not incident or not _INCIDENT_RE.match(incident):
            self.err(node, f"{where}: explains needs the rule's own incident label as a plain word "
                           "(labels: {incident: gpu_fault, ...})")
            return None
        items = self.sequence(keys["incidents"][1], f"{where}: explains incidents") if "incidents" in keys else []
        if not items:
            if "incidents" not in keys or isinstance(keys["incidents"][1], SequenceNode):
                self.err(node, f"{where}: an explains item needs 'incidents', a list of the incidents this one "
                               "explains (e.g. incidents: [queue_blocking])")
            return None
        names: list[str] = []
        for n in items:
            name = self.string(n, "an incident", required=True)
            if name is None:
                continue
            if not _INCIDENT_RE.match(name):
                self.err(n, f"{where}: explains: {name!r} is not an incident id (a word such as queue_blocking)")
            elif name == incident:
                self.err(n, f"{where}: explains: {incident} cannot explain itself; list the other incidents it causes")
            else:
                names.append(name)
        equal: list[str] = []
        for n in self.sequence(keys["equal"][1], f"{where}: explains equal") if "equal" in keys else []:
            label = self.string(n, "a label name", required=True)
            if label is not None and not _LABEL_NAME_RE.match(label):
                self.err(n, f"{where}: explains equal: invalid label name {label!r} (e.g. equal: [instance])")
            elif label is not None:
                equal.append(label)
        return Explains(names, equal)
