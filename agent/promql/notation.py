"""promtool's series notation: expanding 'a+bxn' values and loading `input_series` into a store.

    expand_series_values('1+2x2 _ stale') -> [1.0, 3.0, 5.0, None, STALE]

As in promtool, sample i of a series lands at t = i * interval from 0; `_` leaves a gap, `stale`
writes a staleness marker (the store's NULL value).
"""

from __future__ import annotations

import re

import promql_parser as pp

from vllm_sentinel.agent.promql.parser import PromQLError, matchers_of, parse
from vllm_sentinel.collectors.base import Batch, format_labels


class _Stale:
    """The staleness marker in an expanded value list (stored as NULL)."""

    def __repr__(self) -> str:
        return "STALE"


STALE = _Stale()

_NUM = r"(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+\.|0[xX][0-9a-fA-F]+|(?i:inf|nan))"
_ITEM = re.compile(rf"^(?P<a>[+-]?{_NUM}|stale)(?:(?P<b>[+-]{_NUM}))?(?:x(?P<n>[0-9]+))?$")
_BLANK = re.compile(r"^_(?:x(?P<n>[0-9]+))?$")


def _number(text: str) -> float:
    body = text.lstrip("+-")
    sign = -1.0 if text.startswith("-") else 1.0
    if body[:2].lower() == "0x":
        return sign * float(int(body, 16))
    return sign * float(body)


def expand_series_values(text: str) -> list[float | None | _Stale]:
    """Expand promtool's value notation: 'a+bxn' (n+1 values), 'axn', '_' / '_xn' (gaps), 'stale'.

    Example: '0+5x3 _ 7' -> [0.0, 5.0, 10.0, 15.0, None, 7.0]
    """
    out: list[float | None | _Stale] = []
    for item in text.split():
        blank = _BLANK.match(item)
        if blank:
            out.extend([None] * (int(blank.group("n")) if blank.group("n") else 1))
            continue
        m = _ITEM.match(item)
        if not m:
            raise PromQLError(f"bad series value {item!r} in {text!r}: expected a number, 'a+bxn', "
                              "'axn', '_' or 'stale'")
        start = STALE if m.group("a") == "stale" else _number(m.group("a"))
        if m.group("n") is None:
            if m.group("b") is not None:
                raise PromQLError(f"bad series value {item!r}: 'a+b' needs a repeat count, as in 'a+bxn'")
            out.append(start)
            continue
        count = int(m.group("n"))
        if m.group("b") is None or start is STALE:
            out.extend([start] * (count + 1))
            continue
        step = _number(m.group("b"))
        value = start
        for _ in range(count + 1):
            out.append(value)
            value += step  # accumulate as promtool does, so rounding matches
    return out


def parse_series_selector(text: str) -> tuple[str, dict[str, str]]:
    """'vllm:x{instance="a:8000",engine="0"}' -> ('vllm:x', {'instance': 'a:8000', 'engine': '0'})."""
    node = parse(text)
    if not isinstance(node, pp.VectorSelector) or node.offset is not None:
        raise PromQLError(f"input series {text!r} must be a plain series selector like name{{label=\"v\"}}")
    name = None
    labels: dict[str, str] = {}
    for label, op, value in matchers_of(node):
        if op != "=":
            raise PromQLError(f"input series {text!r}: only label=\"value\" pairs are allowed, not {op}")
        if label == "__name__":
            name = value
        else:
            labels[label] = value
    if not name:
        raise PromQLError(f"input series {text!r} has no metric name")
    return name, labels


def load_input_series(store, input_series: list[dict], interval_ms: int, instance_default: str = "") -> int:
    """Append promtool `input_series` entries ({series, values}) to the store; returns samples written.

    Sample i lands at t = i * interval_ms; '_' writes nothing; 'stale' writes a NULL (staleness marker).
    """
    if interval_ms <= 0:
        raise PromQLError(f"interval must be positive, got {interval_ms} ms")
    by_instance: dict[str, Batch] = {}
    total = 0
    for entry in input_series:
        if "series" not in entry:
            raise PromQLError(f"input_series entry without 'series': {entry!r}")
        name, labels = parse_series_selector(entry["series"])
        instance = labels.pop("instance", instance_default)
        text = format_labels(labels)
        batch = by_instance.setdefault(instance, Batch(instance=instance, ts_ms=0))
        values = entry.get("values", "")
        for i, v in enumerate(expand_series_values(str(values))):
            if v is None:
                continue
            batch.add(name, text, None if v is STALE else float(v), ts_ms=i * interval_ms)
            total += 1
    store.append_many(list(by_instance.values()))
    return total
