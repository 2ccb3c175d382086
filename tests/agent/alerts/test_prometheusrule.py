"""`rules export --format prometheusrule`: a PrometheusRule the operator's CRD schema accepts and whose rules promtool accepts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.resources import resource_problems
from vllm_sentinel.agent.alerts.rulefile import expand_rule_paths, load_rule_files
from vllm_sentinel.agent.alerts.rulepack import packaged_rules_dir

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_sentinel", *args], capture_output=True, text=True, timeout=120)


def exported(*args: str) -> dict:
    res = cli("rules", "export", "--format", "prometheusrule", *args)
    assert res.returncode == 0, res.stderr
    return yaml.safe_load(res.stdout)


@needs_promtool
def test_the_resource_fits_the_crd_and_its_spec_passes_promtool_check_rules(tmp_path):
    doc = exported("--namespace", "monitoring", "--label", "release=kube-prometheus-stack")
    assert resource_problems(doc) == []
    assert doc["metadata"] == {"name": "vllm-sentinel", "namespace": "monitoring", "labels": {
        "app.kubernetes.io/name": "vllm-sentinel", "release": "kube-prometheus-stack"}}
    shipped = load_rule_files(expand_rule_paths([packaged_rules_dir()]))
    assert [g["name"] for g in doc["spec"]["groups"]] == [g.name for f in shipped for g in f.groups]
    rules = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    assert len(rules) == sum(len(f.rules) for f in shipped)
    # our keys left the rule for annotations; no parameter placeholder is left
    assert all(set(r) <= {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"} for r in rules)
    assert all("evidence" in r["annotations"] for r in rules if "alert" in r)
    assert "${" not in yaml.safe_dump(doc["spec"])
    spec_file = tmp_path / "spec.rules.yaml"
    spec_file.write_text(yaml.safe_dump(doc["spec"], sort_keys=False))
    check = subprocess.run([PROMTOOL, "check", "rules", str(spec_file)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and f"SUCCESS: {len(rules)} rules found" in check.stdout, check.stdout + check.stderr


def test_params_are_applied(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("queue_time_p95_seconds: 2.5\n")
    doc = exported("--params", str(params))
    queue = next(r for g in doc["spec"]["groups"] for r in g["rules"] if r.get("alert") == "VllmQueueBlocking")
    assert "> 2.5" in queue["expr"] and "> 1\n" not in queue["expr"]


def test_the_crd_check_can_fail():
    doc = exported()
    rule = doc["spec"]["groups"][0]["rules"][0]
    rule["for"] = "5 minutes"
    assert any("for" in p for p in resource_problems(doc))
    rule["for"] = "5m"
    doc["spec"]["groups"][0]["interval_seconds"] = 30
    assert resource_problems(doc) == ["PrometheusRule.spec.groups[0].interval_seconds: not in the PrometheusRule schema"]


@pytest.mark.parametrize("args, expected", [
    (("--name", "Vllm_Sentinel"), "--name 'Vllm_Sentinel': a Kubernetes name is lower-case letters"),
    (("--label", "release"), "--label 'release': write KEY=VALUE"),
    (("--label", "release=a b"), "--label release=a b: a Kubernetes label value is at most 63"),
    (("--format", "helm"), "--format 'helm': use files or prometheusrule"),
])
def test_bad_options_are_one_line(args, expected):
    res = cli("rules", "export", "--format", "prometheusrule", *args)
    assert res.returncode in (1, 2) and "Traceback" not in res.stderr
    assert expected in " ".join(res.stderr.split()), res.stderr


def test_out_writes_the_file(tmp_path):
    out = tmp_path / "k8s" / "prometheusrule.yaml"
    res = cli("rules", "export", "--format", "prometheusrule", "--out", str(out))
    assert res.returncode == 0 and res.stdout == ""
    assert yaml.safe_load(out.read_text())["kind"] == "PrometheusRule"
