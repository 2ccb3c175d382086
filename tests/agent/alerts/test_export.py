"""`rules export`: plain Prometheus rule files and tests that the real promtool accepts and passes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_sentinel.agent.alerts.rulepack import packaged_rules_dir
from vllm_sentinel.agent.alerts.rulefile import load_rule_file, rule_test_path
from vllm_sentinel.agent.alerts.export import ExportError, export_rules, extra_annotations
from vllm_sentinel.agent.alerts.ruletest import run_tests

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def shipped() -> tuple[list[Path], list[Path]]:
    rules = sorted(packaged_rules_dir().glob("*.yaml"))
    return rules, [rule_test_path(r) for r in rules]


@needs_promtool
def test_every_shipped_rule_test_passes_under_ours_and_under_promtool_after_export(tmp_path: Path) -> None:
    rules, tests = shipped()
    assert rules and all(t.is_file() for t in tests), "every rule file needs rules/tests/<name>.test.yaml"
    code, outcomes = run_tests(tests)
    assert code == 0, "\n".join(e for o in outcomes for e in o.errors)

    result = export_rules(rules, tests, tmp_path)
    check = promtool("check", "rules", *map(str, result.rule_files))
    assert check.returncode == 0, check.stdout + check.stderr
    test = promtool("test", "rules", *map(str, result.test_files))
    assert test.returncode == 0, test.stdout + test.stderr
    # and the exported tests still pass under our runner
    assert run_tests(result.test_files)[0] == 0


def test_our_keys_become_string_annotations(tmp_path: Path) -> None:
    rules, tests = shipped()
    result = export_rules(rules, tests, tmp_path)
    doc = yaml.safe_load(result.rule_files[0].read_text())
    alert = next(r for g in doc["groups"] for r in g["rules"] if "alert" in r)
    assert set(alert) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
    ann = alert["annotations"]
    assert all(isinstance(v, str) for v in ann.values())
    source = next(r for r in load_rule_file(rules[0]).rules if r.is_alert)
    assert json.loads(ann["evidence"])[0]["signal"] == source.evidence[0].signal
    assert json.loads(ann["fix"])[0]["param"] == source.fix[0].param
    assert ann["description"] == source.description
    test_doc = yaml.safe_load(result.test_files[0].read_text())
    assert test_doc["rule_files"] == ["../" + rules[0].name]


RULE = """\
groups:
- name: g
  rules:
  - alert: Braces
    expr: up == 0
    labels: {incident: target_down, severity: high}
    annotations: {summary: "{{ $labels.instance }} down"}
    description: "literal {{ braces }} stay literal"
    evidence: [{signal: up, expr: 'up{job="x"}', unit: ""}]
"""
TEST = """\
rule_files: [../r.yaml]
tests:
- interval: 1m
  input_series: [{series: 'up{instance="a"}', values: '0 0'}]
  alert_rule_test:
  - eval_time: 1m
    alertname: Braces
    exp_alerts:
    - exp_labels: {incident: target_down, severity: high, instance: a}
      exp_annotations: {summary: a down}
"""


@needs_promtool
def test_template_braces_in_our_keys_survive_export(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "r.yaml").write_text(RULE)
    (src / "tests" / "r.test.yaml").write_text(TEST)
    assert run_tests([src / "tests" / "r.test.yaml"])[0] == 0
    result = export_rules([src / "r.yaml"], [src / "tests" / "r.test.yaml"], tmp_path / "out")
    exported_test = yaml.safe_load(result.test_files[0].read_text())
    expected = exported_test["tests"][0]["alert_rule_test"][0]["exp_alerts"][0]["exp_annotations"]
    assert expected["description"] == "literal {{ braces }} stay literal"
    p = promtool("test", "rules", str(result.test_files[0]))
    assert p.returncode == 0, p.stdout + p.stderr


def test_annotation_clash_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RULE.replace('annotations: {summary: "{{ $labels.instance }} down"}',
                                                  'annotations: {summary: s, evidence: mine}'))
    rule = load_rule_file(tmp_path / "r.yaml").rules[0]
    with pytest.raises(ExportError, match="has annotation\\(s\\) evidence"):
        extra_annotations(rule)


def test_test_using_an_unexported_rule_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "r.yaml").write_text(RULE)
    (tmp_path / "other.yaml").write_text(RULE)
    (tmp_path / "tests" / "r.test.yaml").write_text(TEST.replace("../r.yaml", "../other.yaml"))
    with pytest.raises(ExportError, match="not among the exported rule files"):
        export_rules([tmp_path / "r.yaml"], [tmp_path / "tests" / "r.test.yaml"], tmp_path / "out")


def test_cli_export_then_check(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vllm_sentinel.agent.cli.rules import app

    runner = CliRunner()
    res = runner.invoke(app, ["export", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.stdout and (tmp_path / "tests").is_dir()
    assert runner.invoke(app, ["check"]).exit_code == 0
    assert runner.invoke(app, ["list", "--format", "json"]).exit_code == 0
