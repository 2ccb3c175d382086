"""Every file under deploy/: Kubernetes resources against their schemas, the systemd unit, the Dockerfile, the adapter rule."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.resources import resource_problems
from vllm_sentinel.agent.cli.run import run
from vllm_sentinel.agent.cli.run_config import load_run_config, option_kinds
from vllm_sentinel.agent.daemon.file_sd import parse_targets

DEPLOY = Path(__file__).parents[2] / "deploy"
YAMLS = sorted(DEPLOY.rglob("*.yaml"))
RESOURCES = [p for p in YAMLS if "apiVersion" in p.read_text()]
PROMTOOL = shutil.which("promtool")


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(kind: str) -> dict:
    found = [d for p in RESOURCES for d in docs(p) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} under deploy/"
    return found[0]


def test_every_yaml_under_deploy_is_checked():
    assert {p.relative_to(DEPLOY).as_posix() for p in YAMLS} == {
        "kubernetes/vllm-deployment.yaml", "kubernetes/service.yaml", "kubernetes/podmonitor.yaml",
        "kubernetes/prometheusrule.yaml", "kubernetes/sentinel-config.yaml",
        "autoscaling/keda-scaledobject.yaml", "autoscaling/hpa.yaml", "autoscaling/prometheus-adapter-rules.yaml",
        "systemd/sentinel.yaml", "systemd/targets.yaml"}  # a new file needs a check here


@pytest.mark.parametrize("path", RESOURCES, ids=lambda p: p.name)
def test_kubernetes_resources_fit_their_schemas(path):
    for doc in docs(path):
        assert resource_problems(doc) == [], f"{path.name}: {doc['kind']}"


def test_the_sidecar_pod_is_wired_as_the_daemon_needs():
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    vllm, sentinel = pod["containers"]
    assert sentinel["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in sentinel["env"]
    assert "nvidia.com/gpu" not in sentinel["resources"]["limits"] and vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for c in (vllm, sentinel):  # Guaranteed QoS with whole cores: the static CPU manager gives each its own cores
        assert c["resources"]["requests"] == c["resources"]["limits"]
        assert float(c["resources"]["limits"]["cpu"]).is_integer()
    assert sentinel["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "sentinel-metrics"}
    assert sentinel["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "sentinel-metrics"}
    mounts = {m["mountPath"]: m["name"] for m in sentinel["volumeMounts"]}
    cm = next(d for p in RESOURCES for d in docs(p) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "vllm-sentinel-config")
    sentinel_yaml = yaml.safe_load(cm["data"]["sentinel.yaml"])
    assert Path(sentinel_yaml["db"]).parent.as_posix() in mounts  # the DuckDB file is on the volume
    assert sentinel["args"] == ["run", "--config", "/etc/vllm-sentinel/sentinel.yaml"] and mounts["/etc/vllm-sentinel"] == "sentinel-config"
    assert sentinel_yaml["metrics-host"] == "0.0.0.0" and sentinel["ports"][0]["containerPort"] == sentinel_yaml["metrics-port"]
    pm = by_kind("PodMonitor")
    assert {"port": "sentinel-metrics", "path": "/metrics", "interval": "15s"} in pm["spec"]["podMetricsEndpoints"]
    assert pm["spec"]["selector"]["matchLabels"] == by_kind("Deployment")["spec"]["selector"]["matchLabels"]


def test_the_config_files_are_valid_run_configs_and_targets_files(tmp_path):
    for text, name in [(next(d for d in docs(DEPLOY / "kubernetes/sentinel-config.yaml"))["data"]["sentinel.yaml"], "k8s.yaml"),
                       ((DEPLOY / "systemd/sentinel.yaml").read_text(), "systemd.yaml")]:
        path = tmp_path / name
        path.write_text(text)
        assert load_run_config(path, option_kinds(run))  # every key is an option of run, typed right
    assert len(parse_targets((DEPLOY / "systemd/targets.yaml").read_bytes(), DEPLOY / "systemd/targets.yaml")) == 3


def test_the_shipped_prometheusrule_is_a_fresh_export():
    res = subprocess.run([sys.executable, "-m", "vllm_sentinel", "rules", "export", "--format", "prometheusrule",
                          "--label", "release=kube-prometheus-stack"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0
    assert (DEPLOY / "kubernetes/prometheusrule.yaml").read_text() == res.stdout, (
        "regenerate: vllm-sentinel rules export --format prometheusrule --label release=kube-prometheus-stack "
        "--out deploy/kubernetes/prometheusrule.yaml")


def test_autoscalers_read_desired_replicas_for_the_served_model():
    served = next(a.split("=", 1)[1] for a in by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
                  if a.startswith("--served-model-name="))
    hpa = by_kind("HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]
    assert hpa["metric"] == {"name": "vllm_sentinel_desired_replicas", "selector": {"matchLabels": {"model_name": served}}}
    assert hpa["target"] == {"type": "AverageValue", "averageValue": "1"}
    trigger = by_kind("ScaledObject")["spec"]["triggers"][0]
    assert trigger["metadata"]["query"] == f'sum(vllm_sentinel_desired_replicas{{model_name="{served}"}})'
    assert trigger["metadata"]["threshold"] == "1"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) not installed")
def test_the_adapter_rule_and_the_keda_query_are_promql(tmp_path):
    config = yaml.safe_load(next(d for d in docs(DEPLOY / "autoscaling/prometheus-adapter-rules.yaml"))["data"]["config.yaml"])
    rule = config["externalRules"][0]
    assert set(rule) == {"seriesQuery", "resources", "name", "metricsQuery"}  # the adapter's rule keys
    assert re.match(rule["name"]["matches"], "vllm_sentinel_desired_replicas")
    # the adapter fills <<.Series>>, <<.LabelMatchers>> (from the HPA's selector, plus namespace) and <<.GroupBy>>
    rendered = (rule["metricsQuery"].replace("<<.Series>>", "vllm_sentinel_desired_replicas")
                .replace("<<.LabelMatchers>>", 'namespace="default",model_name="llama-3.1-8b-instruct"'))
    exprs = [rule["seriesQuery"], rendered, by_kind("ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]]
    path = tmp_path / "q.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": [{"record": f"q:{i}", "expr": e}
                                                                       for i, e in enumerate(exprs)]}]}))
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def unit_sections(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_systemd_unit_is_hardened_and_ptrace_only_in_the_drop_in():
    unit = unit_sections(DEPLOY / "systemd/vllm-sentinel.service")
    service = unit["Service"]
    assert service["User"] == "vllm-sentinel" and service["ProtectSystem"] == "strict"
    assert service["ReadWritePaths"] == "/var/lib/vllm-sentinel" and service["NoNewPrivileges"] == "yes"
    assert service["CapabilityBoundingSet"] == "" and service["AmbientCapabilities"] == ""
    assert service["ExecStart"].split()[1:] == ["run", "--config", "/etc/vllm-sentinel/sentinel.yaml"]
    drop_in = unit_sections(DEPLOY / "systemd/vllm-sentinel.service.d/stacks.conf")["Service"]
    assert drop_in["CapabilityBoundingSet"] == drop_in["AmbientCapabilities"] == "CAP_SYS_PTRACE"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_accepts_the_unit_and_its_drop_in(tmp_path):
    """systemd-analyze checks every directive; ExecStart points at this checkout's vllm-sentinel, the rest is as shipped."""
    exe = Path(sys.executable).with_name("vllm-sentinel")
    unit = (DEPLOY / "systemd/vllm-sentinel.service").read_text().replace("/opt/vllm-sentinel/bin/vllm-sentinel", str(exe))
    (tmp_path / "vllm-sentinel.service").write_text(unit)
    (tmp_path / "vllm-sentinel.service.d").mkdir()
    shutil.copy(DEPLOY / "systemd/vllm-sentinel.service.d/stacks.conf", tmp_path / "vllm-sentinel.service.d")
    def verify() -> tuple[int, list[str]]:
        res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "vllm-sentinel.service")],
                             capture_output=True, text=True, timeout=60, env={"SYSTEMD_UNIT_PATH": f"{tmp_path}:"})
        # it exits 0 on unknown keys and bad values, and says so on stderr: any line about the unit is a problem
        return res.returncode, [line for line in (res.stdout + res.stderr).splitlines() if "vllm-sentinel.service" in line]

    assert verify() == (0, [])
    (tmp_path / "vllm-sentinel.service").write_text(unit.replace("ProtectSystem=strict", "ProtectSystm=strict"))
    assert any("Unknown key 'ProtectSystm'" in line for line in verify()[1])  # the check can fail


def test_dockerfile_installs_the_package_with_its_extras_and_runs_the_cli():
    text = (DEPLOY / "docker/Dockerfile").read_text()
    assert re.search(r'pip install "/src\[nvml,pyspy,charts\]"', text)
    assert 'ENTRYPOINT ["vllm-sentinel"]' in text and "EXPOSE 9464" in text
    copied = re.findall(r"^COPY (\S+)", text, re.M)
    root = Path(__file__).parents[2]
    assert all((root / c).exists() for c in copied)
    # the package's own folders are all copied (pyproject's package-dir is what pip installs from)
    pyproject = (root / "pyproject.toml").read_text()
    dirs = {m.split("/")[0] for m in re.findall(r'^"vllm_sentinel[\w.]*" = "([\w/]+)"', pyproject, re.M)}
    assert dirs <= set(copied), dirs - set(copied)
