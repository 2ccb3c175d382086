"""Rule unit tests in promtool's format, run over the store and our PromQL engine.

Same file format (`rule_files`, `evaluation_interval`, `group_eval_order`, `tests` with
`interval`, `input_series`, `alert_rule_test`, `promql_expr_test`, `external_labels`,
`external_url`, `name`), same evaluation loop (rules evaluated every `evaluation_interval` from
0 up to the largest `eval_time`; an alert test at `eval_time` reads the state of the evaluation
at the largest step <= `eval_time`), same verdicts, failure text and exit codes (0 pass, 1 fail)
as promtool 2.42 (cmd/promtool/unittest.go). `--run` filters test groups by name and `--junit`
writes a JUnit XML report, as later promtool versions do. A test group may also hold
`episode_test` cases (agent/alerts/episodetest.py), which promtool does not know.
"""

from __future__ import annotations

import glob
import math
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from vllm_sentinel.agent.alerts.episodetest import (CASE_KEYS, EPISODE_KEYS, EpisodeCaseError, EpisodeRunner,
                                                   check_episode_case)
from vllm_sentinel.agent.alerts.state import FIRING, GroupEvaluator, RuleEvalError, store_sink, to_vector
from vllm_sentinel.agent.alerts.rulefile import load_rule_file
from vllm_sentinel.agent.alerts.rulemodel import RuleFileError, RuleGroup
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.notation import load_input_series
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.exposition import parse_labels
from vllm_sentinel.collectors.timefmt import (format_go_duration_ms, format_prometheus_duration_ms,
                                              parse_prometheus_duration_ms)

SUCCESS, FAILURE = 0, 1

# allowed keys per level, as promtool's structs (yaml.UnmarshalStrict rejects anything else)
_SCHEMA: dict[str, tuple[str, ...]] = {
    "unitTestFile": ("rule_files", "evaluation_interval", "group_eval_order", "tests"),
    "testGroup": ("interval", "input_series", "alert_rule_test", "promql_expr_test", "external_labels",
                  "external_url", "name", "episode_test"),
    "series": ("series", "values"),
    "alertTestCase": ("eval_time", "alertname", "exp_alerts"),
    "alert": ("exp_labels", "exp_annotations"),
    "promqlTestCase": ("expr", "eval_time", "exp_samples"),
    "sample": ("labels", "value"),
    "episodeTestCase": CASE_KEYS,
    "episode": EPISODE_KEYS,
}
_CHILDREN = {("unitTestFile", "tests"): "testGroup", ("testGroup", "input_series"): "series",
             ("testGroup", "alert_rule_test"): "alertTestCase", ("alertTestCase", "exp_alerts"): "alert",
             ("testGroup", "promql_expr_test"): "promqlTestCase", ("promqlTestCase", "exp_samples"): "sample",
             ("testGroup", "episode_test"): "episodeTestCase", ("episodeTestCase", "exp_episodes"): "episode"}


class TestFileError(ValueError):
    """The test file itself is malformed (not a test failure)."""


@dataclass
class GroupOutcome:
    """The result of one test group (a JUnit test case)."""

    name: str
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class FileOutcome:
    """The result of one test file: errors in promtool's words, per-group outcomes."""

    path: str
    errors: list[str] = field(default_factory=list)
    groups: list[GroupOutcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every test in the file passed."""
        return not self.errors


# -- formatting as Go does ------------------------------------------------------------------------
def _quote(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def go_labels(labels: dict[str, str]) -> str:
    """Prometheus' Labels.String: {'a': '1', '__name__': 'x'} -> '{__name__="x", a="1"}'."""
    return "{" + ", ".join(f"{k}={_quote(v)}" for k, v in sorted(labels.items())) + "}"


def go_float_e(v: float) -> str:
    """strconv.FormatFloat(v, 'E', -1, 64): 3.0 -> '3E+00', 0.25 -> '2.5E-01'."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, v) < 0 else ""
    if v == 0:
        return f"{sign}0E+00"
    _, digits, exp = Decimal(repr(abs(v))).normalize().as_tuple()
    ds = "".join(map(str, digits))
    e = len(ds) - 1 + exp
    body = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
    return f"{sign}{body}E{'-' if e < 0 else '+'}{abs(e):02d}"


def _indent_lines(text: str, indent: str) -> str:
    lines = text.split("\n")
    return "\n".join(lines[:1] + [indent + line for line in lines[1:]])


def _alerts_string(alerts: list[tuple[dict[str, str], dict[str, str]]]) -> str:
    if not alerts:
        return "[]"
    parts = [f"{i}:" + _indent_lines(f"\nLabels:{go_labels(lb)}\nAnnotations:{go_labels(an)}", "  ")
             for i, (lb, an) in enumerate(alerts)]
    return "[\n" + ",\n".join(parts) + "\n]"


def _sort_key(labels: dict[str, str]) -> tuple:
    return tuple(sorted(labels.items()))


def parse_metric(text: str) -> dict[str, str]:
    """Series notation to labels: 'x{a="1"}' -> {'__name__': 'x', 'a': '1'}; ValueError if malformed."""
    m = re.fullmatch(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(.*)\})?\s*", text, re.S)
    if not m or (m.group(1) is None and m.group(2) is None):
        raise ValueError(f"1:1: parse error: unexpected input {text!r}")
    labels = parse_labels(m.group(2)) if m.group(2) and m.group(2).strip() else {}
    if m.group(1):
        labels["__name__"] = m.group(1)
    return labels


# -- reading the test file ------------------------------------------------------------------------
def _check_keys(node: Node, kind: str, problems: list[str]) -> None:
    """promtool's yaml.UnmarshalStrict: unknown fields are errors."""
    if isinstance(node, MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, ScalarNode) else "?"
            if key not in _SCHEMA[kind]:
                problems.append(f"  line {k.start_mark.line + 1}: field {key} not found in type main.{kind}")
                continue
            child = _CHILDREN.get((kind, key))
            if child and isinstance(v, SequenceNode):
                for item in v.value:
                    _check_keys(item, child, problems)


def read_test_file(path: str | Path) -> dict[str, Any]:
    """Parse and strictly check a test file; TestFileError says what is wrong and where."""
    text = Path(path).read_text()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise TestFileError(f"yaml: {e}") from None
    problems: list[str] = []
    if root is not None:
        _check_keys(root, "unitTestFile", problems)
    if problems:
        raise TestFileError("yaml: unmarshal errors:\n" + "\n".join(problems))
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise TestFileError("yaml: unmarshal errors:\n  line 1: cannot unmarshal into main.unitTestFile")
    return data


def _duration(value: Any, what: str) -> int:
    if value is None:
        return 0
    try:
        return parse_prometheus_duration_ms(str(value))
    except ValueError as e:
        raise TestFileError(f"{what}: {e}") from None


def resolve_rule_files(base: Path, patterns: list[str]) -> tuple[list[Path], list[str]]:
    """Rule files relative to the test file, globs expanded; warnings for patterns matching nothing."""
    files: list[Path] = []
    warnings: list[str] = []
    for pat in patterns or []:
        full = pat if Path(pat).is_absolute() else str(base / pat)
        matches = sorted(glob.glob(full))
        if not matches:
            warnings.append(f"  WARNING: no file match pattern {full}")
        files.extend(Path(m) for m in matches)
    return files, warnings


# -- running ----------------------------------------------------------------------------------
def run_test_file(path: str | Path, run: list[str] | None = None, episodes: EpisodeRunner | None = None) -> FileOutcome:
    """Run every test group of one test file (those whose name matches a `run` regex, if given);
    `episodes` runs its episode_test cases (agent/diagnosis' grouping, passed in by the caller)."""
    path = Path(path)
    out = FileOutcome(str(path))
    try:
        data = read_test_file(path)
    except (OSError, TestFileError) as e:
        out.errors.append(str(e) if isinstance(e, TestFileError) else f"open {path}: {e.strerror}")
        return out
    try:
        rule_paths, out.warnings = resolve_rule_files(path.parent, data.get("rule_files") or [])
        eval_interval = _duration(data.get("evaluation_interval"), "evaluation_interval") or 60_000
        order: dict[str, int] = {}
        for i, name in enumerate(data.get("group_eval_order") or []):
            if name in order:
                raise TestFileError(f"group name repeated in evaluation order: {name}")
            order[name] = i
    except TestFileError as e:
        out.errors.append(str(e))
        return out
    patterns = [re.compile(r) for r in run or []]
    for index, tg in enumerate(data.get("tests") or []):
        name = (tg or {}).get("name") or ""
        if patterns and not any(p.search(name) for p in patterns):
            continue
        started = time.perf_counter()
        try:
            errs = _run_group(tg or {}, eval_interval, order, rule_paths, episodes)
        except (TestFileError, EpisodeCaseError) as e:
            errs = [str(e)]
        outcome = GroupOutcome(name or f"{path.name}#{index}", errs, time.perf_counter() - started)
        out.groups.append(outcome)
        out.errors.extend(errs)
    return out


def _load_groups(rule_paths: list[Path], order: dict[str, int]) -> tuple[list[RuleGroup], list[str]]:
    groups: list[RuleGroup] = []
    errors: list[str] = []
    for p in rule_paths:
        try:
            groups.extend(load_rule_file(p).groups)
        except RuleFileError as e:
            errors.extend(e.problems)
    # promtool orders groups named in group_eval_order first, the rest keep file order here
    groups.sort(key=lambda g: order.get(g.name, 0))
    return groups, errors


def _make_engine(store: Store) -> Any:
    return Engine(store, lookback_ms=300_000)


def _run_group(tg: dict[str, Any], eval_interval: int, order: dict[str, int],
               rule_paths: list[Path], episodes: EpisodeRunner | None = None) -> list[str]:
    interval = _duration(tg.get("interval"), "interval")
    group_name = tg.get("name") or ""
    store = Store.open(":memory:")
    try:
        try:
            load_input_series(store, tg.get("input_series") or [], interval)
        except Exception as e:  # the notation module's parse errors: promtool reports them the same way
            return [str(e)]
        groups, errors = _load_groups(rule_paths, order)
        if errors:
            return errors
        engine = _make_engine(store)
        evaluator = GroupEvaluator(groups, engine.instant, store_sink(store),
                                   external_labels={str(k): str(v) for k, v in (tg.get("external_labels") or {}).items()},
                                   external_url=str(tg.get("external_url") or ""))
        alert_tests = tg.get("alert_rule_test") or []
        promql_tests = tg.get("promql_expr_test") or []
        for at in alert_tests:
            if not at.get("alertname"):
                suffix = f" (in TestGroup {group_name})" if group_name else ""
                return [f"an item under alert_rule_test misses required attribute alertname at eval_time "
                        f"{format_prometheus_duration_ms(_duration(at.get('eval_time'), 'eval_time'))}{suffix}"]
        by_time: dict[int, list[dict]] = {}
        for at in alert_tests:
            by_time.setdefault(_duration(at.get("eval_time"), "eval_time"), []).append(at)
        times = sorted(by_time)
        # episode cases read recording rules' output too: evaluate up to their times as well
        episode_times = [_duration(c.get("eval_time"), "eval_time") for c in tg.get("episode_test") or []
                         if isinstance(c, dict)]
        max_t = max([*times, *(_duration(p.get("eval_time"), "eval_time") for p in promql_tests), *episode_times],
                    default=0)

        errs: list[str] = []
        curr = 0
        ts = 0
        while ts <= max_t:
            results = evaluator.eval(ts)
            eval_errs = [f"    rule: {r.rule.name}, time: {format_go_duration_ms(ts)}, err: {r.error}"
                         for r in results if r.error is not None]
            if eval_errs:
                return errs + eval_errs
            while curr < len(times) and ts <= times[curr] < ts + eval_interval:
                t = times[curr]
                errs.extend(_check_alerts(evaluator, groups, by_time[t], t, group_name))
                curr += 1
            ts += eval_interval
        for pt in promql_tests:
            errs.extend(_check_expr(engine, pt))
        for case in tg.get("episode_test") or []:
            errs.extend(check_episode_case(case, episodes, store, groups, eval_interval, group_name))
        return errs
    finally:
        store.close()


def _check_alerts(evaluator: GroupEvaluator, groups: list[RuleGroup], cases: list[dict], t: int,
                  group_name: str) -> list[str]:
    wanted = {c["alertname"] for c in cases}
    got: dict[str, list[tuple[dict[str, str], dict[str, str]]]] = {}
    for g in groups:
        for r in g.rules:
            if r.is_alert and r.name in wanted:
                for a in evaluator.state(r).active_alerts():
                    if a.state == FIRING:
                        got.setdefault(r.name, []).append((dict(a.labels), dict(a.annotations)))
    errs = []
    for case in cases:
        name = case["alertname"]
        exp = []
        for a in case.get("exp_alerts") or []:
            labels = {str(k): str(v) for k, v in ((a or {}).get("exp_labels") or {}).items()}
            labels["alertname"] = name
            annotations = {str(k): str(v) for k, v in ((a or {}).get("exp_annotations") or {}).items()}
            exp.append((labels, annotations))
        have = sorted(got.get(name, []), key=lambda la: (_sort_key(la[0]), _sort_key(la[1])))
        exp.sort(key=lambda la: (_sort_key(la[0]), _sort_key(la[1])))
        if exp != have:
            prefix = f"    name: {group_name},\n" if group_name else ""
            pad = " " * 12
            errs.append(f"{prefix}    alertname: {name}, time: {format_prometheus_duration_ms(t)}, \n"
                        f"        exp:{_indent_lines(_alerts_string(exp), pad)}, \n"
                        f"        got:{_indent_lines(_alerts_string(have), pad)}")
    return errs


def _check_expr(engine: Any, case: dict) -> list[str]:
    expr = str(case.get("expr") or "")
    t = _duration(case.get("eval_time"), "eval_time")
    when = format_prometheus_duration_ms(t)
    try:
        got = to_vector(engine.instant(expr, t))
    except RuleEvalError:
        return [f'    expr: {_quote(expr)}, time: {when}, err: rule result is not a vector or scalar']
    except Exception as e:  # PromQLError / Unsupported: promtool prints the engine's error the same way
        return [f"    expr: {_quote(expr)}, time: {when}, err: {e}"]
    exp = []
    for s in case.get("exp_samples") or []:
        try:
            labels = parse_metric(str(s.get("labels") or ""))
        except ValueError as e:
            return [f'    expr: {_quote(expr)}, time: {when}, err: labels {_quote(str(s.get("labels")))}: {e}']
        exp.append((labels, float(s.get("value") or 0)))
    exp.sort(key=lambda s: _sort_key(s[0]))
    got.sort(key=lambda s: _sort_key(s[0]))
    same = len(exp) == len(got) and all(a[0] == b[0] and a[1] == b[1] for a, b in zip(exp, got))
    if same:
        return []
    show = lambda ss: ", ".join(f"{go_labels(l)} {go_float_e(v)}" for l, v in ss) or "nil"  # noqa: E731
    return [f"    expr: {_quote(expr)}, time: {when},\n        exp: {show(exp)}\n        got: {show(got)}"]


# -- reporting --------------------------------------------------------------------------------
def run_tests(paths: list[str | Path], run: list[str] | None = None,
              episodes: EpisodeRunner | None = None) -> tuple[int, list[FileOutcome]]:
    """Run test files; returns promtool's exit code (0 all passed, 1 otherwise) and the outcomes."""
    outcomes = [run_test_file(p, run, episodes) for p in paths]
    return (SUCCESS if all(o.ok for o in outcomes) else FAILURE), outcomes


def promtool_lines(outcomes: list[FileOutcome]) -> list[tuple[str, str]]:
    """The output promtool prints for these outcomes, as (stream, text) pairs; stream is 'out' or 'err'."""
    lines: list[tuple[str, str]] = []
    for o in outcomes:
        lines.append(("out", f"Unit Testing:  {o.path}"))
        lines.extend(("err", w) for w in o.warnings)
        if o.errors:
            lines.append(("err", "  FAILED:"))
            for e in o.errors:
                lines.append(("err", e))
                lines.append(("out", ""))
        else:
            lines.append(("out", "  SUCCESS"))
        lines.append(("out", ""))
    return lines


def junit_xml(outcomes: list[FileOutcome]) -> str:
    """A JUnit XML report: one testsuite per file, one testcase per test group."""
    root = ET.Element("testsuites")
    for o in outcomes:
        suite = ET.SubElement(root, "testsuite", name=o.path, tests=str(len(o.groups) or 1),
                              failures=str(sum(1 for g in o.groups if g.errors) or (0 if o.ok else 1)),
                              time=f"{sum(g.seconds for g in o.groups):.3f}")
        cases = o.groups or [GroupOutcome(Path(o.path).name, o.errors)]
        for g in cases:
            case = ET.SubElement(suite, "testcase", name=g.name, classname=o.path, time=f"{g.seconds:.3f}")
            if g.errors:
                fail = ET.SubElement(case, "failure", message=g.errors[0].strip().splitlines()[0][:200])
                fail.text = "\n".join(g.errors)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
