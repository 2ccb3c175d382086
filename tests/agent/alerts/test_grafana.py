"""`export grafana`: a dashboard that fits Grafana's dashboard model, one row per family, PromQL that Prometheus parses."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.agent.alerts.grafana_model import dashboard_problems
from vllm_sentinel.agent.alerts.rulefile import expand_rule_paths, load_rule_files
from vllm_sentinel.agent.alerts.rulepack import packaged_rules_dir
from vllm_sentinel.agent.promql.parser import parse
from vllm_sentinel.agent.promql.selectors import selectors

PROMTOOL = shutil.which("promtool")


def export(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "vllm_sentinel", "export", "grafana", *args],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def dash() -> dict:
    return export()


def test_the_dashboard_fits_grafanas_dashboard_model(dash):
    assert dashboard_problems(dash) == []
    assert dash["id"] is None and dash["uid"] == "vllm-sentinel"  # imports as a new dashboard, re-imports replace it


def test_a_row_per_incident_family_and_a_panel_per_rule_with_its_evidence(dash):
    groups = [g for f in load_rule_files(expand_rule_paths([packaged_rules_dir()])) for g in f.groups]
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == [g.name for g in groups if any(r.is_alert and r.evidence for r in g.rules)]
    panels = {p["title"].split(" ")[0]: p for p in dash["panels"] if p["type"] == "timeseries"}
    rules = {r.name: r for g in groups for r in g.rules if r.is_alert and r.evidence}
    assert set(panels) == set(rules)
    for name, rule in rules.items():
        targets = panels[name]["targets"]
        assert [t["legendFormat"].split(" ", 1)[1] for t in targets] == [e.signal for e in rule.evidence]
        for t, e in zip(targets, rule.evidence):
            # the same query as the rule's evidence, scoped by the variables
            assert [s.name for s in selectors(parse(t["expr"]))] == [s.name for s in selectors(parse(e.expr))]
            for sel in selectors(parse(t["expr"])):
                labels = {m.name: m.value for m in sel.matchers.matchers}
                assert labels["instance"] == "$instance"
                assert (labels.get("model_name") == "$model_name") == sel.name.startswith("vllm:")
    queue = panels["VllmQueueBlocking"]
    override = next(o for o in queue["fieldConfig"]["overrides"] if o["matcher"]["options"] == "A")
    assert {"id": "unit", "value": "s"} in override["properties"]
    steps = next(p for p in override["properties"] if p["id"] == "thresholds")["value"]["steps"]
    assert steps[-1]["value"] == 1.0  # the rule's queue_time_p95_seconds threshold


def test_variables_and_datasources_as_vllms_dashboards(dash):
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "model_name", "instance"]
    assert dash["templating"]["list"][0]["type"] == "datasource" and dash["templating"]["list"][0]["query"] == "prometheus"
    text = json.dumps(dash)
    datasources = [p["datasource"] for p in dash["panels"] if "datasource" in p]
    assert all(d == {"type": "prometheus", "uid": "${datasource}"} for d in datasources)
    assert "DS_PROMETHEUS" not in text and "__inputs" not in dash  # no import-time prompt: imports without edits


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")
def test_every_panel_query_parses_in_prometheus(dash, tmp_path):
    exprs = [t["expr"].replace("$model_name", ".*").replace("$instance", ".*")
             for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"][1:]]  # label_values() is Grafana's, not PromQL
    promql = exprs[:-2]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e}
                                                         for i, e in enumerate(promql)]}]}
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and f"SUCCESS: {len(promql)} rules found" in check.stdout, check.stdout + check.stderr


def test_the_model_check_can_fail(dash):
    broken = copy.deepcopy(dash)
    panel = next(p for p in broken["panels"] if p["type"] == "timeseries")
    panel["gridPos"]["w"] = "12"
    panel["targets"][0]["query"] = panel["targets"][0].pop("expr")  # Loki's key, not Prometheus'
    problems = dashboard_problems(broken)
    assert any(p.endswith("grid_pos.w: expected int, got '12'") for p in problems), problems
    assert any(p.endswith("targets[0].query: not in Grafana's dashboard model") for p in problems), problems


def test_params_and_out(tmp_path):
    params = tmp_path / "p.yaml"
    params.write_text("queue_time_p95_seconds: 2.5\n")
    out = tmp_path / "d.json"
    res = subprocess.run([sys.executable, "-m", "vllm_sentinel", "export", "grafana", "--params", str(params),
                          "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout == "", res.stderr
    doc = json.loads(out.read_text())
    queue = next(p for p in doc["panels"] if p["title"].startswith("VllmQueueBlocking"))
    steps = [p for o in queue["fieldConfig"]["overrides"] for p in o["properties"] if p["id"] == "thresholds"]
    assert steps[0]["value"]["steps"][-1]["value"] == 2.5
