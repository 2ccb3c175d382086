"""`explains` in rule files: the schema's one-line errors, the lint of unknown incidents, the links a pack
declares, and `rules export` leaving them (and the episode_test cases) out for promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from vllm_sentinel.agent.alerts.explains import causal_links
from vllm_sentinel.agent.alerts.export import export_rules
from vllm_sentinel.agent.alerts.rulefile import parse_rule_text
from vllm_sentinel.agent.alerts.rulelint import lint_rules
from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.alerts.ruletest import run_test_file
from vllm_sentinel.agent.cli.rules import app
from vllm_sentinel.agent.diagnosis.window import evaluate_episodes

PROMTOOL = shutil.which("promtool")
RULE = """\
groups:
- name: g
  rules:
  - alert: Stall
    expr: up == 0
    labels: {{incident: engine_stall, severity: critical}}
    annotations: {{summary: s}}
{extra}
  - alert: Queue
    expr: up == 0
    labels: {{incident: queue_blocking, severity: high}}
    annotations: {{summary: q}}
"""


def problems(extra: str) -> list[str]:
    with pytest.raises(RuleFileError) as e:
        parse_rule_text(RULE.format(extra=extra), "r.yaml")
    return e.value.problems


def test_a_rule_declares_what_it_explains_with_equal_labels() -> None:
    rf = parse_rule_text(RULE.format(extra="    explains:\n    - {incidents: [queue_blocking], equal: [instance]}"))
    [link] = causal_links([rf]).links
    assert (link.cause, link.effect, link.equal, link.where) == ("engine_stall", "queue_blocking", ("instance",),
                                                                 "<string>:4")


@pytest.mark.parametrize("extra, expect", [
    ("    explains: [{incidents: queue_blocking}]", "r.yaml:8:28: group \"g\", rule 1, \"Stall\": explains incidents must be a list"),
    ("    explains: [{equal: [instance]}]", "an explains item needs 'incidents'"),
    ("    explains: [{incidents: [engine_stall]}]", "engine_stall cannot explain itself"),
    ("    explains: [{incidents: ['queue blocking']}]", "'queue blocking' is not an incident id"),
    ("    explains: [{incidents: [queue_blocking], equal: [in-stance]}]", "invalid label name 'in-stance'"),
    ("    explains: [{incidents: [queue_blocking], matching: [instance]}]", "unknown key 'matching' in an explains item"),
    ("    explains: {incidents: [queue_blocking]}", "explains must be a list"),
])
def test_a_malformed_explains_is_one_line_naming_file_line_and_fix(extra: str, expect: str) -> None:
    [problem] = problems(extra)
    assert expect in problem and problem.startswith("r.yaml:") and "\n" not in problem


def test_explains_needs_an_alert_with_an_incident_label() -> None:
    text = RULE.format(extra="    explains: [{incidents: [queue_blocking]}]").replace("incident: engine_stall, ", "")
    with pytest.raises(RuleFileError) as e:
        parse_rule_text(text, "r.yaml")
    assert any("explains needs the rule's own incident label" in p for p in e.value.problems)
    rec = "groups:\n- name: g\n  rules:\n  - record: x\n    expr: up\n    explains: [{incidents: [a]}]\n"
    with pytest.raises(RuleFileError) as e:
        parse_rule_text(rec, "r.yaml")
    assert e.value.problems == ["r.yaml:6:5: group \"g\", rule 1, \"x\": invalid field 'explains' in recording rule"]


def test_lint_names_an_explained_incident_no_rule_raises() -> None:
    rf = parse_rule_text(RULE.format(extra="    explains: [{incidents: [queue_bloking]}]"), "r.yaml")
    found = [p for p in lint_rules([rf]) if "queue_bloking" in p]
    assert found == ["r.yaml:4: alert Stall explains 'queue_bloking', which no rule raises "
                     "(incidents: engine_stall, queue_blocking)"]


def test_the_shipped_pack_declares_the_links_an_operator_needs() -> None:
    pairs = {(link.cause, link.effect) for link in causal_links(load_pack()).links}
    for cause in ("gpu_fault", "engine_stall"):
        for effect in ("queue_blocking", "traffic_burst", "ttft_slo_breach", "tpot_slo_breach"):
            assert (cause, effect) in pairs
    assert {("kv_cache_pressure", "queue_blocking"), ("kv_cache_pressure", "ttft_slo_breach"),
            ("prefill_hol_blocking", "ttft_slo_breach")} <= pairs


EPISODE_TEST = """\
rule_files: [../r.yaml]
evaluation_interval: 15s
tests:
- name: both
  interval: 15s
  input_series:
  - {series: 'up{instance="a:8000"}', values: '1 0x8'}
  alert_rule_test:
  - eval_time: 1m
    alertname: Queue
    exp_alerts:
    - exp_labels: {incident: queue_blocking, severity: high, instance: "a:8000"}
      exp_annotations: {summary: q}
  episode_test:
  - eval_time: 2m
    exp_episodes:
    - {instance: "a:8000", roots: [engine_stall], caused_by: {queue_blocking: [engine_stall]}}
- name: only episodes
  interval: 15s
  input_series:
  - {series: 'up{instance="a:8000"}', values: '1 0x8'}
  episode_test:
  - eval_time: 2m
    exp_episodes:
    - {roots: [queue_blocking]}
"""


def write_pack(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "tests").mkdir()
    rules = tmp_path / "r.yaml"
    rules.write_text(RULE.format(extra="    explains:\n    - {incidents: [queue_blocking], equal: [instance]}"))
    test = tmp_path / "tests" / "r.test.yaml"
    test.write_text(EPISODE_TEST)
    return rules, test


def test_episode_test_cases_pass_fail_and_say_what_differs(tmp_path: Path) -> None:
    _rules, test = write_pack(tmp_path)
    out = run_test_file(test, episodes=evaluate_episodes)
    [failure] = out.errors  # the first group holds; the second expects the symptom as a root
    assert failure.startswith("    name: only episodes,\n    episodes, time: 2m, \n")
    assert "exp: [roots queue_blocking]" in failure
    assert "got: [a:8000: roots engine_stall; queue_blocking <- engine_stall]" in failure
    # without vllm-sentinel's grouping (promtool's view) the cases cannot run, and say so
    bare = run_test_file(test)
    assert any("episode_test needs vllm-sentinel's episode grouping" in e for e in bare.errors)


def test_rules_test_runs_episode_cases_from_the_cli(tmp_path: Path) -> None:
    _rules, test = write_pack(tmp_path)
    res = CliRunner().invoke(app, ["test", str(test)])
    assert res.exit_code == 1 and "name: only episodes" in res.output
    test.write_text(EPISODE_TEST.replace("{roots: [queue_blocking]}", "{roots: [engine_stall], caused_by: "
                                                                       "{queue_blocking: [engine_stall]}}"))
    assert CliRunner().invoke(app, ["test", str(test)]).exit_code == 0


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")
def test_export_drops_explains_and_episode_cases_and_promtool_passes(tmp_path: Path) -> None:
    rules, test = write_pack(tmp_path)
    test.write_text(EPISODE_TEST.replace("{roots: [queue_blocking]}", "{roots: [engine_stall], caused_by: "
                                                                       "{queue_blocking: [engine_stall]}}"))
    result = export_rules([rules], [test], tmp_path / "out")
    exported_rules = yaml.safe_load(result.rule_files[0].read_text())
    assert all("explains" not in r for g in exported_rules["groups"] for r in g["rules"])
    exported_test = yaml.safe_load(result.test_files[0].read_text())
    assert [g["name"] for g in exported_test["tests"]] == ["both"]  # the episodes-only group is gone
    assert "episode_test" not in exported_test["tests"][0]
    check = subprocess.run([PROMTOOL, "test", "rules", str(result.test_files[0])], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
