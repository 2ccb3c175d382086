"""Functions of labels: label_replace() and the labels absent() reports."""

from __future__ import annotations

import re

import promql_parser as pp

from vllm_sentinel.agent.promql.parser import PromQLError, matchers_of
from vllm_sentinel.agent.promql.vectors import Labels, Vec, dedupe, labels_key


def absent_labels(node: pp.Expr) -> Labels:
    """Labels absent() reports: the selector's equality matchers, as Prometheus derives them."""
    if isinstance(node, pp.MatrixSelector):
        node = node.vector_selector
    if not isinstance(node, pp.VectorSelector):
        return ()
    out: dict[str, str] = {}
    has: set[str] = set()
    for name, op, value in matchers_of(node):
        if name == "__name__":
            continue
        if op == "=" and name not in has:
            out[name] = value
            has.add(name)
        else:
            out.pop(name, None)
    return labels_key(out)


_GO_GROUP = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def label_replace(vec: Vec, dst: str, repl: str, src: str, regex: str) -> Vec:
    """label_replace(vec, dst, repl, src, regex) with Go's $1 / ${name} expansion."""
    try:
        rx = re.compile(f"(?:{regex})")
    except re.error as e:
        raise PromQLError(f"invalid regular expression in label_replace(): {regex}") from e
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", dst):
        raise PromQLError(f"invalid destination label name in label_replace(): {dst}")
    keys = []
    for k in vec.keys:
        d = dict(k)
        m = rx.fullmatch(d.get(src, ""))
        if m is None:
            keys.append(k)
            continue

        def group(g: re.Match) -> str:
            name = g.group(1) or g.group(2)
            try:
                return m.group(int(name) if name.isdigit() else name) or ""
            except (IndexError, re.error):
                return ""

        res = _GO_GROUP.sub(group, repl)
        d.pop(dst, None)
        if res:
            d[dst] = res
        keys.append(labels_key(d))
    return dedupe(Vec(keys, vec.v, vec.ok), whole_series=False)
