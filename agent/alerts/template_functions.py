"""The functions alert templates may call: Prometheus' template functions (humanize*, printf, reReplaceAll, ...).

`query`, `externalURL`, `pathPrefix`, `and` and `or` need the evaluator (a query function, short
circuits): their entries are None and agent/alerts/templating.py runs them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from vllm_sentinel.agent.alerts.gofmt import go_sprintf, go_str
from vllm_sentinel.collectors.timefmt import parse_prometheus_duration_ms


class TemplateError(ValueError):
    """A template that does not parse or cannot be expanded; the message says where."""


def _to_float(v: Any) -> float:
    if isinstance(v, bool):
        raise TemplateError(f"can't convert bool to float")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise TemplateError(f'strconv.ParseFloat: parsing "{v}": invalid syntax') from None
    raise TemplateError(f"can't convert {type(v).__name__} to float")


def humanize(x: Any) -> str:
    """Prometheus humanize: 0.3333 -> '333.3m', 1234567 -> '1.235M'."""
    v = _to_float(x)
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return _g4(v) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _g4(v) + prefix


def humanize1024(x: Any) -> str:
    """Prometheus humanize1024: 2048 -> '2ki'."""
    v = _to_float(x)
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return _g4(v) + prefix


def humanize_duration(x: Any) -> str:
    """Prometheus humanizeDuration: 90 -> '1m 30s', 0.25 -> '250ms'."""
    v = _to_float(x)
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    if v == 0:
        return _g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = int(v)
        seconds, minutes, hours, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{_g4(v)}{prefix}s"


def humanize_percentage(x: Any) -> str:
    """Prometheus humanizePercentage: 0.1234 -> '12.34%'."""
    return _g4(_to_float(x) * 100) + "%"


def humanize_timestamp(x: Any) -> str:
    """Prometheus humanizeTimestamp: 0 -> '1970-01-01 00:00:00 +0000 UTC'."""
    v = _to_float(x)
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    return go_str(datetime.fromtimestamp(v, tz=timezone.utc))


def _g4(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return "%.4g" % v


@dataclass
class QuerySample:
    """One element of a template `query` result, as Prometheus' template sample."""

    Labels: dict[str, str]
    Value: float


QueryFunc = Callable[[str], list[QuerySample]]


def _first(v: list) -> QuerySample:
    if not v:
        raise TemplateError("first() called on vector with no elements")
    return v[0]


def _strip_port(hp: str) -> str:
    m = re.fullmatch(r"\[(.*)\]:\d*|([^:]*):\d*", hp)
    return (m.group(1) or m.group(2)) if m else hp


def _strip_domain(hp: str) -> str:
    m = re.fullmatch(r"(\[.*\]|[^:]*)(?::(\d*))?", hp)
    host, port = (m.group(1), m.group(2)) if m else (hp, None)
    if re.fullmatch(r"[\d.]+|\[?[0-9a-fA-F:]*\]?", host) and host:
        return hp
    host = host.split(".")[0]
    return f"{host}:{port}" if port else host


def _parse_duration(d: str) -> float:
    return parse_prometheus_duration_ms(d) / 1000


def _cmp(a: Any, b: Any) -> tuple[Any, Any]:
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        raise TemplateError(f"incompatible types for comparison")
    return a, b


def truth(v: Any) -> bool:
    """Go template truth: false for nil, false, 0, and empty strings, maps and lists."""
    return not (v is None or v is False or v == 0 and not isinstance(v, bool) and isinstance(v, (int, float))
                or (isinstance(v, (str, dict, list, tuple)) and len(v) == 0))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "humanize": humanize,
    "humanize1024": humanize1024,
    "humanizeDuration": humanize_duration,
    "humanizePercentage": humanize_percentage,
    "humanizeTimestamp": humanize_timestamp,
    "printf": go_sprintf,
    "print": lambda *a: "".join(go_str(x) for x in a),
    "println": lambda *a: " ".join(go_str(x) for x in a) + "\n",
    "title": lambda s: re.sub(r"(?<![\w'])(\w)", lambda m: m.group(1).upper(), s),
    "toUpper": lambda s: s.upper(),
    "toLower": lambda s: s.lower(),
    "match": lambda pattern, text: re.search(pattern, text) is not None,
    "reReplaceAll": lambda pattern, repl, text: re.sub(pattern, re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", repl), text),
    "stripPort": _strip_port,
    "stripDomain": _strip_domain,
    "parseDuration": _parse_duration,
    "toTime": lambda x: datetime.fromtimestamp(_to_float(x), tz=timezone.utc),
    "first": _first,
    "value": lambda s: s.Value,
    "label": lambda name, s: s.Labels.get(name, ""),
    "sortByLabel": lambda name, v: sorted(v, key=lambda s: s.Labels.get(name, "")),
    "args": lambda *a: {f"arg{i}": x for i, x in enumerate(a)},
    "safeHtml": lambda s: s,
    "len": len,
    "index": lambda m, *keys: _index(m, keys),
    "eq": lambda a, *bs: any(_cmp(a, b)[0] == b for b in bs),
    "ne": lambda a, b: _cmp(a, b)[0] != b,
    "lt": lambda a, b: _cmp(a, b)[0] < b,
    "le": lambda a, b: _cmp(a, b)[0] <= b,
    "gt": lambda a, b: _cmp(a, b)[0] > b,
    "ge": lambda a, b: _cmp(a, b)[0] >= b,
    "not": lambda a: not truth(a),
    "and": None,  # short-circuit: handled by the evaluator (templating.py)
    "or": None,
    "query": None,  # needs the evaluator's query function: handled by the evaluator
    "externalURL": None,
    "pathPrefix": None,
}


def _index(m: Any, keys: tuple) -> Any:
    for k in keys:
        if isinstance(m, dict):
            m = m.get(k, "")
        elif isinstance(m, (list, tuple)):
            m = m[int(k)]
        else:
            raise TemplateError(f"can't index item of type {type(m).__name__}")
    return m
