"""A dashboard checked against Grafana's dashboard model as grafana-foundation-sdk publishes it (PyPI).

The SDK's classes are generated from Grafana's own schema (the dashboard kind, the panel and
query plugins' schemas). A dashboard fits when (1) decoding it into those classes and encoding it
back loses no key (an unknown or misplaced key is dropped by the decoder) and (2) every decoded
value has the type its class declares (the decoder itself does not check types).
"""

from __future__ import annotations

import enum
import json
import types
import typing
from typing import Any

from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as grafana_dashboard

plugins.register_default_plugins()  # panels and queries decode into their plugin's classes (timeseries, prometheus)


def dashboard_problems(doc: dict) -> list[str]:
    """What in `doc` Grafana's dashboard model does not hold: lost keys and wrongly typed values."""
    model = grafana_dashboard.Dashboard.from_json(doc)
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    problems = [f"{path}: not in Grafana's dashboard model" for path in _lost(doc, back, "dashboard")]
    return problems + _typed(model, "dashboard")


def _lost(ours: Any, theirs: Any, path: str) -> list[str]:
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [path]
        return [p for k, v in ours.items() if not (v is None and k not in theirs)
                for p in ([f"{path}.{k}"] if k not in theirs else _lost(v, theirs[k], f"{path}.{k}"))]
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [path]
        return [p for i, (a, b) in enumerate(zip(ours, theirs)) for p in _lost(a, b, f"{path}[{i}]")]
    return []


def _typed(obj: Any, path: str) -> list[str]:
    hints = typing.get_type_hints(type(obj), vars(__import__(type(obj).__module__, fromlist=["_"])))
    return [p for attr, hint in hints.items() for p in _check(getattr(obj, attr, None), hint, f"{path}.{attr}")]


def _check(value: Any, hint: Any, path: str) -> list[str]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (Any, object):  # a panel's options and custom field config: the plugin's class, when decoded
        return _typed(value, path) if type(value).__module__.startswith("grafana_foundation_sdk.models") else []
    if value is None and (origin in (typing.Union, types.UnionType) and type(None) in args):
        return []
    if origin in (typing.Union, types.UnionType):
        matching = [a for a in args if isinstance(a, type) and not issubclass(a, (int, str, float, enum.Enum))
                    and isinstance(value, a)]
        tries = [_check(value, a, path) for a in (matching or [a for a in args if a is not type(None)])]
        return [] if any(not t for t in tries) else min(tries, key=len)
    if origin is typing.Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in _check(v, args[0] if args else Any, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [p for k, v in value.items() for p in _check(v, args[1] if args else Any, f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return [] if isinstance(value, hint) or value in {e.value for e in hint} else [
            f"{path}: {value!r} is not one of {[e.value for e in hint]}"]
    if hint is float:
        return [] if isinstance(value, (int, float)) and not isinstance(value, bool) else [f"{path}: expected a number, got {value!r}"]
    if hint in (int, str, bool):
        ok = isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
        return [] if ok else [f"{path}: expected {hint.__name__}, got {value!r}"]
    if isinstance(hint, type):
        return _typed(value, path) if isinstance(value, hint) else [f"{path}: expected {hint.__name__}, got {type(value).__name__}"]
    return []
