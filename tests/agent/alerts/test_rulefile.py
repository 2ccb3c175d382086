"""Rule-file loading: Prometheus' format plus our keys, strict, with file:line in every message."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.agent.alerts.rulefile import load_rule_file, load_rule_files, parse_rule_text
from vllm_sentinel.agent.alerts.rulelint import lint_rules
from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.collectors.timefmt import format_prometheus_duration_ms, parse_prometheus_duration_ms

GOOD = """\
groups:
- name: kv
  interval: 30s
  rules:
  - record: job:x:rate1m
    expr: sum(rate(x[1m]))
  - alert: KvPressure
    expr: job:x:rate1m > 0.1
    for: 1m
    keep_firing_for: 2m
    labels: {incident: kv_cache_pressure, severity: high}
    annotations:
      summary: "{{ $labels.instance }}: {{ $value | humanize }}"
    description: why it matters
    references: [https://example.invalid/a]
    evidence:
    - {signal: preemptions, expr: 'rate(x[1m])', threshold: 0.1, unit: 1/s}
    fix:
    - {param: --max-num-seqs, compute: halve_max_num_seqs, why: fewer sequences}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(RuleFileError) as e:
        parse_rule_text(text, "r.yaml")
    return e.value.problems


def test_loads_prometheus_keys_and_ours() -> None:
    rf = parse_rule_text(GOOD, "r.yaml")
    g = rf.groups[0]
    assert (g.name, g.interval_ms, g.line) == ("kv", 30_000, 2)
    rec, alert = g.rules
    assert (rec.kind, rec.name, rec.line) == ("record", "job:x:rate1m", 5)
    assert (alert.for_ms, alert.keep_firing_for_ms, alert.incident, alert.severity) == (60_000, 120_000,
                                                                                         "kv_cache_pressure", "high")
    assert alert.evidence[0].signal == "preemptions" and alert.evidence[0].threshold == 0.1
    assert alert.evidence[0].unit == "1/s"
    assert alert.fix[0].param == "--max-num-seqs" and alert.fix[0].compute == "halve_max_num_seqs"
    assert alert.references == ["https://example.invalid/a"] and alert.description == "why it matters"
    assert alert.where == "r.yaml:7"


def test_unknown_rule_key_names_file_line_and_allowed_keys() -> None:
    [p] = problems(GOOD.replace("    annotations:", "    anotations:"))
    assert p.startswith("r.yaml:12:5: unknown key 'anotations'")
    assert "allowed keys: record, alert, expr, for, keep_firing_for, labels, annotations, description" in p


@pytest.mark.parametrize("old,new,expect", [
    ("- name: kv\n", "- name: kv\n  evaluation: 1m\n", "r.yaml:3:3: unknown key 'evaluation' in a group"),
    ("unit: 1/s}", "unit: 1/s, units: s}", "unknown key 'units' in an evidence item; allowed keys: signal, expr"),
    ("why: fewer sequences}", "why: x, value: 3}", "unknown key 'value' in a fix item"),
    ("groups:", "group:", "r.yaml:1:1: unknown key 'group' in the rule file; allowed keys: groups"),
])
def test_unknown_keys_at_every_level(old: str, new: str, expect: str) -> None:
    assert any(expect in p for p in problems(GOOD.replace(old, new)))


def test_every_problem_is_reported_with_its_line() -> None:
    text = """\
groups:
- name: g
  rules:
  - record: 'bad name'
    expr: sum(
    for: 1m
  - alert: B
    expr: up
    for: 5minutes
    annotations: {summary: '{{ nope $value }}'}
  - expr: up
- name: g
"""
    ps = problems(text)
    assert any(p.startswith("r.yaml:5:11:") and "could not parse expression" in p for p in ps)
    assert any(p.startswith("r.yaml:6:5:") and "invalid field 'for' in recording rule" in p for p in ps)
    assert any("invalid recording rule name: bad name" in p for p in ps)
    assert any(p.startswith("r.yaml:9:10:") and 'not a valid duration string: "5minutes"' in p for p in ps)
    assert any(p.startswith("r.yaml:10:18:") and 'function "nope" not defined' in p for p in ps)
    assert any(p.startswith("r.yaml:11:5:") and "one of 'record' or 'alert' must be set" in p for p in ps)
    assert any(p.startswith("r.yaml:12:3:") and 'groupname: "g" is repeated' in p for p in ps)


def test_repeated_key_and_bad_yaml() -> None:
    assert any("key 'expr' repeated" in p and "first at line 6" in p
               for p in problems(GOOD.replace("    expr: sum(rate(x[1m]))\n",
                                              "    expr: sum(rate(x[1m]))\n    expr: x\n")))
    [p] = problems("groups:\n- name: [unclosed\n")
    assert p.startswith("r.yaml:3:1: not valid YAML")


def test_evidence_needs_signal_and_expr_and_a_number_threshold() -> None:
    ps = problems(GOOD.replace("{signal: preemptions, expr: 'rate(x[1m])', threshold: 0.1",
                               "{expr: 'rate(x[1m])', threshold: high"))
    assert any("needs 'signal'" in p for p in ps)


def test_durations() -> None:
    assert parse_prometheus_duration_ms("1m30s") == 90_000
    assert parse_prometheus_duration_ms("0") == 0
    assert parse_prometheus_duration_ms("1h5ms") == 3_600_005
    for bad in ("", "1.5m", "5minutes", "m"):
        with pytest.raises(ValueError):
            parse_prometheus_duration_ms(bad)
    assert [format_prometheus_duration_ms(x) for x in (0, 90_000, 3_600_000, 90 * 86_400_000, 7 * 86_400_000)] == \
        ["0s", "1m30s", "1h", "90d", "1w"]


def test_load_rule_files_collects_problems_from_all_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD.replace("annotations:", "anotations:"))
    (tmp_path / "b.yaml").write_text("groups:\n- name: x\n  rulez: []\n")
    with pytest.raises(RuleFileError) as e:
        load_rule_files([tmp_path])
    assert [p.split(":")[0] for p in e.value.problems] == [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    with pytest.raises(RuleFileError, match="cannot read rule file"):
        load_rule_file(tmp_path / "missing.yaml")


def test_lint_conventions(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "tests" / "a.test.yaml").write_text("tests: []\n")
    (tmp_path / "b.yaml").write_text("""\
groups:
- name: b
  rules:
  - alert: KvPressure
    expr: up == 0
    labels: {severity: low}
""")
    ps = lint_rules(load_rule_files([tmp_path]), known_fixes=set())
    b = str(tmp_path / "b.yaml")
    assert any(p.startswith(f"{b}: no test file; write {tmp_path / 'tests' / 'b.test.yaml'}") for p in ps)
    assert any(p.startswith(f"{b}:4: alert name KvPressure is already used at {tmp_path / 'a.yaml'}:7") for p in ps)
    assert any(p.startswith(f"{b}:4: alert KvPressure has no 'incident' label") for p in ps)
    assert any(p.startswith(f"{b}:4: alert KvPressure has no 'summary' annotation") for p in ps)
    assert any("compute 'halve_max_num_seqs', which is not registered" in p for p in ps)
    assert lint_rules(load_rule_files([tmp_path / "a.yaml"]), known_fixes={"halve_max_num_seqs"}) == []


def test_shipped_rules_load_and_pass_lint() -> None:
    from vllm_sentinel.agent.alerts.rulepack import packaged_rules_dir
    from vllm_sentinel.agent.diagnosis.fixes import FIXES

    files = load_rule_files([packaged_rules_dir()])
    assert files and lint_rules(files, set(FIXES)) == []
