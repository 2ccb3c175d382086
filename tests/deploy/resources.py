"""Kubernetes resources checked offline against their schemas, from packages on PyPI (no cluster needed).

* Kubernetes' own kinds (Deployment, Service, ConfigMap, HorizontalPodAutoscaler, ...): the
  OpenAPI-derived JSON schemas that `kubernetes-validate` ships, in strict mode (unknown keys
  are errors), for Kubernetes 1.30.
* Custom resources (PrometheusRule, PodMonitor: Prometheus Operator 0.80; ScaledObject: KEDA
  2.16): the models `cloudcoil-models-prometheus-operator` / `cloudcoil-models-keda` generate
  from those projects' CRD OpenAPI schemas (types, required fields, patterns). A resource fits
  when it validates and its dump keeps every key (the models drop unknown ones).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pydantic
from cloudcoil.models.keda import v1alpha1 as keda
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator

KUBERNETES_VERSION = "1.30"
CUSTOM = {
    ("monitoring.coreos.com/v1", "PrometheusRule"): prometheus_operator.PrometheusRule,
    ("monitoring.coreos.com/v1", "PodMonitor"): prometheus_operator.PodMonitor,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): prometheus_operator.ServiceMonitor,
    ("keda.sh/v1alpha1", "ScaledObject"): keda.ScaledObject,
}


def resource_problems(doc: dict) -> list[str]:
    """Why `doc` is not a valid resource of its kind (empty: it is)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    model = CUSTOM.get(key)
    if model is None:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            return [f"{'.'.join(str(p) for p in e.path)}: {e.message}"]
        except kubernetes_validate.SchemaNotFoundError as e:
            return [f"no schema for {key}: {e.message}"]
        return []
    try:
        parsed = model.model_validate(doc)
    except pydantic.ValidationError as e:
        return [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
    kept = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return [f"{path}: not in the {key[1]} schema" for path in _dropped(doc, kept, key[1])]


def _dropped(ours: Any, kept: Any, path: str) -> list[str]:
    if isinstance(ours, dict) and isinstance(kept, dict):
        return [p for k, v in ours.items()
                for p in ([f"{path}.{k}"] if k not in kept else _dropped(v, kept[k], f"{path}.{k}"))]
    if isinstance(ours, list) and isinstance(kept, list):
        return [p for i, (a, b) in enumerate(zip(ours, kept)) for p in _dropped(a, b, f"{path}[{i}]")]
    return []
