"""Parsing PromQL with promql-parser, and the small translations the evaluator needs from its AST."""

from __future__ import annotations

from datetime import timedelta

import promql_parser as pp


class PromQLError(Exception):
    """A query that cannot be evaluated: bad syntax, or a runtime error Prometheus would also raise."""


class Unsupported(PromQLError):
    """A valid PromQL construct this engine does not evaluate; the message names it."""


def parse(expr: str) -> pp.Expr:
    """Parse a PromQL expression; syntax errors become PromQLError naming the expression."""
    try:
        return pp.parse(expr)
    except (ValueError, RuntimeError) as e:
        raise PromQLError(f"cannot parse PromQL {expr!r}: {e}") from e


def duration_ms(d: timedelta | None) -> int:
    """A parsed duration (or offset) in integer milliseconds; None -> 0."""
    if d is None:
        return 0
    return d // timedelta(milliseconds=1)


def op_name(tok: object) -> str:
    """The operator or aggregation name of a token: TokenType -> 'sum', '+', 'and', ..."""
    return str(tok).strip().lower()


def matchers_of(sel: pp.VectorSelector) -> list[tuple[str, str, str]]:
    """(label, op, value) triples of a selector, the metric name included as a __name__ matcher."""
    if sel.matchers.or_matchers:
        raise Unsupported("unsupported: `or` inside a label matcher set (not in Prometheus 2.42)")
    out: list[tuple[str, str, str]] = []
    if sel.name:
        out.append(("__name__", "=", sel.name))
    ops = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}
    for m in sel.matchers.matchers:
        out.append((m.name, ops[str(m.op)], m.value))
    return out


def check_at(node: object) -> None:
    """The @ modifier is not evaluated yet: say so instead of ignoring it."""
    if getattr(node, "at", None) is not None:
        raise Unsupported("unsupported: @ modifier")
