"""Rule files: Prometheus rule groups plus vllm-sentinel's keys, loaded with a strict schema.

A file reads like any Prometheus rule file; an alerting rule may also carry `description`,
`references`, `evidence` (named PromQL signals) and `fix` (parameter suggestions). Every problem
is reported with `file:line:col`, and an unknown key names the keys allowed there, so a typo
(`anotations:`) fails loudly instead of dropping a summary.

Thresholds an operator may change are parameters: a top-level `params:` mapping declares each
with its default, and `${name}` anywhere in the file (expr, for, annotations, evidence, fix)
is replaced by its value before the file is parsed. An override file (`--params FILE`, a flat
mapping `name: value`) changes them; a name no loaded file declares is an error that lists the
declared names. Example: `params: {ttft_slo_seconds: 2}` with
`expr: histogram_quantile(0.95, ...) > ${ttft_slo_seconds}` reads `... > 2`, or `... > 1.5`
with an override `ttft_slo_seconds: 1.5`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vllm_sentinel.agent.alerts.templating import TemplateError, check_template

TOP_KEYS = ("groups", "params")
GROUP_KEYS = ("name", "interval", "limit", "rules")
PROMETHEUS_RULE_KEYS = ("record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations")
EXTRA_RULE_KEYS = ("description", "references", "evidence", "fix")
RULE_KEYS = PROMETHEUS_RULE_KEYS + EXTRA_RULE_KEYS
EVIDENCE_KEYS = ("signal", "expr", "threshold", "unit", "description")
FIX_KEYS = ("param", "suggest", "compute", "why")

_DURATION_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DURATION_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_PARAM_REF_RE = re.compile(r"\$\{([^}]*)\}")
_PARAM_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# a parameter value is pasted into YAML and PromQL text: numbers, durations and plain words only
_PARAM_VALUE_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


class RuleFileError(ValueError):
    """One or more problems in rule files; `problems` holds one 'file:line:col: message' each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def parse_duration_ms(text: str) -> int:
    """Prometheus duration to milliseconds: '1m30s' -> 90000, '0' -> 0; ValueError otherwise."""
    text = str(text)
    if text == "0":
        return 0
    m = _DURATION_RE.match(text)
    if not text or not m or not any(m.groups()):
        raise ValueError(f'not a valid duration string: "{text}" (use units y w d h m s ms, e.g. 1m30s)')
    return sum(int(g) * unit for g, unit in zip(m.groups(), _DURATION_MS) if g)


def format_duration_ms(ms: int) -> str:
    """Milliseconds as Prometheus prints a duration: 90000 -> '1m30s', 0 -> '0s', 7776000000 -> '90d'."""
    if ms == 0:
        return "0s"
    out = []
    # years and weeks only when exact, as Prometheus does (90d reads better than 12w6d)
    for unit, name, exact in ((365 * 86_400_000, "y", True), (7 * 86_400_000, "w", True),
                              (86_400_000, "d", False), (3_600_000, "h", False), (60_000, "m", False),
                              (1000, "s", False), (1, "ms", False)):
        if exact and ms % unit:
            continue
        if ms >= unit:
            out.append(f"{ms // unit}{name}")
            ms %= unit
    return "".join(out)


@dataclass
class Evidence:
    """A named signal that proves an incident: a PromQL expression, its unit and threshold."""

    signal: str
    expr: str
    threshold: float | None = None
    unit: str = ""
    description: str = ""


@dataclass
class Fix:
    """A parameter suggestion; `compute` names a registered function that fills in the values."""

    param: str
    suggest: str | None = None
    compute: str | None = None
    why: str | None = None


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
    fix: list[Fix] = field(default_factory=list)
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


class _Loader:
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
            return parse_duration_ms(str(val))
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

    def fix(self, node: Node, where: str) -> Fix | None:
        keys = self.mapping(node, FIX_KEYS, "a fix item")
        if not isinstance(node, MappingNode):
            return None
        param = self.string(keys["param"][1], "param", True) if "param" in keys else None
        if not param:
            self.err(node, f"{where}: a fix item needs 'param' (the engine flag, e.g. --max-num-seqs)")
            return None
        vals = {k: self.string(keys[k][1], k) if k in keys else None for k in ("suggest", "compute", "why")}
        return Fix(param, vals["suggest"], vals["compute"], vals["why"])


ParamValues = Mapping[str, Any]


@dataclass
class ParamOverrides:
    """Parameter values that replace the rule files' defaults, and where they came from (for messages)."""

    values: dict[str, Any]
    source: str = "parameter overrides"


def param_text(value: Any, where: str = "") -> str:
    """A parameter value as pasted into rule text: 2 -> '2', 0.1 -> '0.1', '1m' -> '1m'; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{where}must be a number or a duration, not {str(value).lower()}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where}must be a finite number")
        return repr(value)
    if isinstance(value, str) and _PARAM_VALUE_RE.match(value):
        return value
    raise ValueError(f"{where}{value!r} is not a number, a duration (1m30s) or a plain word")


def _read_params(root: Node | None, path: str, problems: list[str]) -> dict[str, str]:
    """The `params:` mapping of a composed rule file: name -> default as text."""
    if not isinstance(root, MappingNode):
        return {}
    node = next((v for k, v in root.value if isinstance(k, ScalarNode) and k.value == "params"), None)
    if node is None or (isinstance(node, ScalarNode) and node.tag.endswith(":null")):
        return {}
    loader = _Loader(path)
    if not isinstance(node, MappingNode):
        loader.err(node, "params must be a mapping of parameter names to default values")
        problems.extend(loader.problems)
        return {}
    out: dict[str, str] = {}
    for k, v in node.value:
        name = k.value if isinstance(k, ScalarNode) else ""
        if not _PARAM_NAME_RE.match(name):
            loader.err(k, f"invalid parameter name {name!r} (letters, digits and _)")
            continue
        if name in out:
            loader.err(k, f"parameter {name!r} repeated in params")
            continue
        value = loader.scalar(v, f"parameter {name!r}")
        try:
            out[name] = param_text(value, f"parameter {name!r} ")
        except ValueError as e:
            loader.err(v, str(e))
    problems.extend(loader.problems)
    return out


def substitute_params(text: str, values: ParamValues, path: str) -> tuple[str, list[str]]:
    """Replace `${name}` by its value on every non-comment line; unknown names are problems with file:line:col.

    >>> substitute_params("expr: x > ${slo}", {"slo": "2"}, "f")[0]
    'expr: x > 2'
    """
    problems: list[str] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if "${" not in line or line.lstrip().startswith("#"):
            continue

        def repl(m: re.Match, i: int = i) -> str:
            name = m.group(1)
            if name in values:
                return str(values[name])
            problems.append(f"{path}:{i + 1}:{m.start() + 1}: unknown parameter ${{{name}}}; declared in params: "
                            f"{', '.join(sorted(values)) or 'none (add a top-level params: mapping)'}")
            return m.group(0)
        lines[i] = _PARAM_REF_RE.sub(repl, line)
    return "\n".join(lines), problems


def _compose(text: str, path: str) -> Node | None:
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        raise RuleFileError([f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}"]) from None


def parse_rule_text(text: str, path: str = "<string>", params: ParamValues | None = None) -> RuleFile:
    """Parse rule-file text; `params` overrides declared parameters (others are ignored here).

    RuleFileError lists every problem with file:line:col.
    """
    problems: list[str] = []
    root = _compose(text, path)
    values = _read_params(root, path, problems)
    for name, value in (params or {}).items():
        if name in values:
            try:
                values[name] = param_text(value, f"parameter {name!r} ")
            except ValueError as e:
                problems.append(f"{path}: override of {e}")
    if problems:
        raise RuleFileError(problems)
    if "${" in text:
        text, problems = substitute_params(text, values, path)
        if problems:
            raise RuleFileError(problems)
        root = _compose(text, path)
    loader = _Loader(path)
    groups = loader.file(root)
    if loader.problems:
        raise RuleFileError(loader.problems)
    return RuleFile(path, groups, values)


def load_rule_file(path: str | Path, params: ParamValues | None = None) -> RuleFile:
    """Load and validate one rule file, with parameter overrides applied where it declares them."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise RuleFileError([f"{p}: cannot read rule file: {e.strerror or e}"]) from None
    return parse_rule_text(text, str(p), params)


def load_params_file(path: str | Path) -> ParamOverrides:
    """A parameter override file: a YAML mapping `name: value` (or the same under a `params:` key)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise RuleFileError([f"{p}: cannot read parameter file: {e.strerror or e}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        raise RuleFileError([f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}"]) from None
    if isinstance(data, dict) and set(data) == {"params"}:
        data = data["params"]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RuleFileError([f"{p}: a parameter file is a mapping `name: value`, e.g. `ttft_slo_seconds: 1.5`"])
    problems = []
    for name, value in data.items():
        try:
            param_text(value, f"parameter {name!r} ")
        except ValueError as e:
            problems.append(f"{p}: {e}")
    if problems:
        raise RuleFileError(problems)
    return ParamOverrides({str(k): v for k, v in data.items()}, str(p))


def load_rule_files(paths: list[str | Path], params: ParamOverrides | ParamValues | None = None) -> list[RuleFile]:
    """Load several rule files (directories contribute their *.yaml / *.yml), collecting all problems.

    `params` overrides parameters the files declare; a name none of them declares is an error
    naming the override's source and the declared names.
    """
    overrides = params if isinstance(params, ParamOverrides) else ParamOverrides(dict(params or {}))
    files: list[RuleFile] = []
    problems: list[str] = []
    for path in expand_rule_paths(paths):
        try:
            files.append(load_rule_file(path, overrides.values))
        except RuleFileError as e:
            problems.extend(e.problems)
    if problems:
        raise RuleFileError(problems)
    declared = {name for f in files for name in f.params}
    unknown = sorted(set(overrides.values) - declared)
    if unknown:
        raise RuleFileError([f"{overrides.source}: unknown parameter(s) {', '.join(unknown)}; the rule files declare: "
                             f"{', '.join(sorted(declared)) or 'none'}"])
    return files


def expand_rule_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given; a directory stands for its *.yaml and *.yml files (not its tests/)."""
    out: list[Path] = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml") and q.is_file()))
        else:
            out.append(p)
    return out


def rule_test_path(rule_path: Path) -> Path:
    """Where a rule file's tests live: rules/x.yaml -> rules/tests/x.test.yaml."""
    return rule_path.parent / "tests" / f"{rule_path.stem}.test.yaml"


def lint_rules(files: list[RuleFile], known_fixes: set[str] | None = None) -> list[str]:
    """vllm-sentinel's conventions beyond the schema, one 'file:line: problem' each.

    Alert names are unique, an alerting rule has `incident` and `severity` labels and a
    `summary` annotation, every rule file has its test file in tests/, and fix `compute` names
    are registered (when `known_fixes` is given).
    """
    problems: list[str] = []
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
                                    f"(labels: {{incident: <id from DESIGN §4>, severity: ...}})")
            if not r.annotations.get("summary"):
                problems.append(f"{r.where}: alert {r.name} has no 'summary' annotation (one sentence a person can act on)")
            if r.description and "description" in r.annotations:
                problems.append(f"{r.where}: alert {r.name} has both a `description` key and a `description` "
                                "annotation; keep one")
            if known_fixes is not None:
                for f in r.fix:
                    if f.compute and f.compute not in known_fixes:
                        problems.append(f"{r.where}: alert {r.name}: fix {f.param} uses compute {f.compute!r}, "
                                        f"which is not registered (known: {', '.join(sorted(known_fixes)) or 'none'})")
    return problems
