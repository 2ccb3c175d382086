"""`rules test` against the real promtool: same verdicts, same output, same exit codes.

The fixtures in fixtures/ruletest/ are plain Prometheus rules and promtool test files (written
for this test, checked with promtool 2.42): recording rules feeding alerts, `for` and
`keep_firing_for` boundary pairs, templated labels and annotations, external labels, ALERTS,
stale markers and gaps, and failing cases whose failure text must match promtool's byte for byte.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vllm_sentinel.agent.alerts.ruletest import go_float_e, promtool_lines, run_test_file, run_tests
from vllm_sentinel.collectors.timefmt import format_go_duration_ms

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ruletest"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")


def ours(files: list[str], run: list[str] | None = None) -> tuple[int, str, str]:
    code, outcomes = run_tests(files, run)
    lines = promtool_lines(outcomes)
    return (code, "".join(t + "\n" for s, t in lines if s == "out"), "".join(t + "\n" for s, t in lines if s == "err"))


def promtool(files: list[str]) -> tuple[int, str, str]:
    p = subprocess.run([PROMTOOL, "test", "rules", *files], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


@needs_promtool
@pytest.mark.parametrize("name", ["pass", "fail", "badkey", "noname"])
def test_same_output_and_exit_code_as_promtool(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    files = [f"{name}.test.yaml"]
    assert ours(files) == promtool(files)


def test_passing_file_exits_0_and_failing_file_exits_1() -> None:
    code, outcomes = run_tests([FIXTURES / "pass.test.yaml", FIXTURES / "fail.test.yaml"])
    assert code == 1
    assert [o.ok for o in outcomes] == [True, False]
    assert run_tests([FIXTURES / "pass.test.yaml"])[0] == 0


def test_failure_names_the_alert_time_and_both_sides() -> None:
    out = run_test_file(FIXTURES / "fail.test.yaml")
    first = out.errors[0]
    assert first.startswith("    alertname: Down, time: 1m, \n        exp:[")
    assert 'Annotations:{summary="wrong"}' in first and 'Annotations:{summary="b down"}' in first
    assert out.warnings == [f"  WARNING: no file match pattern {FIXTURES / 'nothing*.yaml'}"]


def test_run_filters_test_groups_by_name() -> None:
    out = run_test_file(FIXTURES / "fail.test.yaml", run=["^second"])
    assert [g.name for g in out.groups] == ["second group"]
    assert len(out.errors) == 1 and "name: second group," in out.errors[0]
    assert run_test_file(FIXTURES / "fail.test.yaml", run=["nomatch"]).ok


def test_junit_report(tmp_path: Path) -> None:
    from vllm_sentinel.agent.alerts.ruletest import junit_xml

    _, outcomes = run_tests([FIXTURES / "pass.test.yaml", FIXTURES / "fail.test.yaml"])
    root = ET.fromstring(junit_xml(outcomes))
    suites = root.findall("testsuite")
    assert [s.get("failures") for s in suites] == ["0", "2"]
    cases = suites[1].findall("testcase")
    assert [c.find("failure") is not None for c in cases] == [True, True]


def test_missing_rule_file_and_rule_errors_fail_the_file(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    anotations: {}\n")
    (tmp_path / "t.test.yaml").write_text("rule_files: [r.yaml]\ntests:\n- interval: 1m\n"
                                          "  alert_rule_test: [{eval_time: 0s, alertname: A}]\n")
    out = run_test_file(tmp_path / "t.test.yaml")
    assert not out.ok and "unknown key 'anotations'" in out.errors[0]
    out = run_test_file(tmp_path / "absent.test.yaml")
    assert out.errors == [f"open {tmp_path / 'absent.test.yaml'}: No such file or directory"]


def test_rule_evaluation_error_stops_the_group(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("groups:\n- name: g\n  rules:\n  - record: r\n    expr: x[1m]\n")
    (tmp_path / "t.test.yaml").write_text(
        "rule_files: [r.yaml]\ntests:\n- interval: 1m\n  input_series: [{series: 'x', values: '1 2'}]\n"
        "  promql_expr_test: [{expr: x, eval_time: 2m}]\n")
    out = run_test_file(tmp_path / "t.test.yaml")
    assert out.errors == ["    rule: r, time: 0s, err: rule result is not a vector or scalar"]


def test_go_formatting_helpers() -> None:
    assert [format_go_duration_ms(ms) for ms in (0, 1500, 60_000, 3_600_000, 210_000)] == ["0s", "1.5s", "1m0s", "1h0m0s",
                                                                                 "3m30s"]
    assert [go_float_e(v) for v in (3.0, 0.25, 1 / 3, -2.5, 0.0)] == ["3E+00", "2.5E-01", "3.333333333333333E-01",
                                                                      "-2.5E+00", "0E+00"]


def test_cli_exit_codes_and_junit(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vllm_sentinel.agent.cli.rules import app

    runner = CliRunner()
    ok = runner.invoke(app, ["test", str(FIXTURES / "pass.test.yaml"), "--junit", str(tmp_path / "j.xml")])
    assert ok.exit_code == 0 and "  SUCCESS" in ok.stdout
    assert (tmp_path / "j.xml").read_text().startswith("<?xml")
    bad = runner.invoke(app, ["test", str(FIXTURES / "fail.test.yaml")])
    assert bad.exit_code == 1
    assert runner.invoke(app, ["test", str(FIXTURES / "fail.test.yaml"), "--run", "nomatch"]).exit_code == 0


def test_shipped_rule_tests_pass() -> None:
    from vllm_sentinel.agent.alerts.rulepack import packaged_rules_dir
    from vllm_sentinel.agent.diagnosis.window import evaluate_episodes

    tests = sorted((packaged_rules_dir() / "tests").glob("*.test.yaml"))
    assert tests
    code, outcomes = run_tests(tests, episodes=evaluate_episodes)
    assert code == 0, "\n".join(e for o in outcomes for e in o.errors)

