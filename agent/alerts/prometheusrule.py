"""The rule pack as a Prometheus Operator `PrometheusRule` (monitoring.coreos.com/v1), for a fleet's Prometheus.

The groups are those `rules export` writes (parameters substituted, our keys moved into
annotations), all in one resource. The operator writes one rule file per resource, so group
names must be unique across the pack. Label the resource as the Prometheus' `ruleSelector`
expects (kube-prometheus-stack: `release: <its release name>`).
"""

from __future__ import annotations

import re
from typing import Any

from vllm_sentinel.agent.alerts.export import ExportError, prometheus_rule_file
from vllm_sentinel.agent.alerts.rulemodel import RuleFile

API_VERSION = "monitoring.coreos.com/v1"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def prometheus_rule_resource(rule_files: list[RuleFile], name: str = "vllm-sentinel", namespace: str | None = None,
                             labels: dict[str, str] | None = None) -> dict[str, Any]:
    """One PrometheusRule holding every group of `rule_files`; ExportError for a name Kubernetes refuses."""
    check_object_name(name, "--name")
    if namespace is not None:
        check_object_name(namespace, "--namespace")
    for key, value in (labels or {}).items():
        if not _LABEL_VALUE.match(value) or len(value) > 63:
            raise ExportError(f"--label {key}={value}: a Kubernetes label value is at most 63 letters, digits, "
                              "'-', '_' or '.', starting and ending with a letter or digit")
    groups: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for rf in rule_files:
        for group in prometheus_rule_file(rf)["groups"]:
            if group["name"] in seen:
                raise ExportError(f"{rf.path}: group {group['name']!r} is also in {seen[group['name']]}; the operator "
                                  "puts all groups of a PrometheusRule in one rule file: rename one")
            seen[group["name"]] = str(rf.path)
            groups.append(group)
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/name": "vllm-sentinel", **(labels or {})}
    return {"apiVersion": API_VERSION, "kind": "PrometheusRule", "metadata": metadata, "spec": {"groups": groups}}


def check_object_name(name: str, flag: str) -> None:
    """Refuse a name that is not a DNS-1123 subdomain (what Kubernetes requires of object names)."""
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ExportError(f"{flag} {name!r}: a Kubernetes name is lower-case letters, digits, '-' and '.', "
                          "starting and ending with a letter or digit, e.g. vllm-sentinel")
