"""Scope PromQL to a set of targets: add label matchers to every vector selector of an expression.

`diagnose --prometheus URL --selector '{job="vllm"}'` sends the rule pack to a Prometheus that holds
more than vLLM. Every selector of every expression gets the matchers, inside functions, ranges,
subqueries and both sides of every operator, through the PromQL parser (never by editing text):

    scope_expr('sum by (instance) (rate(vllm:num_preemptions_total[2m])) > 0', parse_selector('{job="vllm"}'))
    -> 'sum by (instance) (rate(vllm:num_preemptions_total{job="vllm"}[2m])) > 0'

The parser prints label values and strings without escaping them, so values are escaped before
printing, and the printed text is parsed again and checked to hold exactly the values intended.
A subquery without a step (`[10m:]`) is sent with Prometheus' default step written out (`[10m:1m]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import promql_parser as pp

from vllm_sentinel.agent.promql.parser import PromQLError, parse

# a subquery without a step runs at the server's global evaluation_interval, 1m unless configured;
# the parser cannot print an empty step, so it is written out as Prometheus' default
DEFAULT_SUBQUERY_STEP = timedelta(minutes=1)
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


@dataclass(frozen=True)
class Matcher:
    """One label matcher: name, op (=, !=, =~, !~) and the value as meant (unescaped)."""

    name: str
    op: str
    value: str


_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}
_PP_OPS = {"=": pp.MatchOp.Equal, "!=": pp.MatchOp.NotEqual, "=~": pp.MatchOp.Re, "!~": pp.MatchOp.NotRe}


def quote(value: str) -> str:
    """A PromQL string literal's body for `value`: 'a"b\\c' -> 'a\\"b\\\\c' (Go's escapes, as Prometheus reads them)."""
    return "".join(_ESCAPES.get(c, c if c.isprintable() else f"\\u{ord(c):04x}") for c in value)


def _escaped(value: str, times: int) -> str:
    for _ in range(times):
        value = quote(value)
    return value


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """`{job="vllm", namespace=~"prod-.*"}` -> its matchers; ValueError names what is wrong and the form wanted."""
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")):
        raise ValueError(f"--selector {text!r}: give label matchers in braces, such as '{{job=\"vllm\"}}'")
    try:
        node = parse(t)
    except PromQLError as e:
        raise ValueError(f"--selector {text!r}: {e}") from None
    if not isinstance(node, pp.VectorSelector) or node.name or node.offset is not None or node.at is not None:
        raise ValueError(f"--selector {text!r}: only label matchers, such as '{{job=\"vllm\"}}'")
    if node.matchers.or_matchers:
        raise ValueError(f"--selector {text!r}: `or` between matchers is not supported; use a regex (=~)")
    out = tuple(Matcher(m.name, _OPS[str(m.op)], m.value) for m in node.matchers.matchers)
    if any(m.name == "__name__" for m in out):
        raise ValueError(f"--selector {text!r}: it scopes targets; a metric name (__name__) cannot be part of it")
    return out


def format_selector(matchers: tuple[Matcher, ...]) -> str:
    """The matchers as PromQL text: (Matcher('job', '=', 'vllm'),) -> '{job="vllm"}'."""
    return "{" + ",".join(f'{m.name}{m.op}"{quote(m.value)}"' for m in matchers) + "}"


def _values(node: pp.Expr) -> list[tuple[str, ...]]:
    """Every matcher and string literal of an expression, in walk order, as their values are meant."""
    out: list[tuple[str, ...]] = []

    def visit(n: pp.Expr) -> None:
        if isinstance(n, pp.VectorSelector):
            out.append(("selector", n.name or "", *sorted(f"{m.name}{_OPS[str(m.op)]}{m.value}"
                                                          for m in n.matchers.matchers)))
        elif isinstance(n, pp.StringLiteral):
            out.append(("string", n.val))

    pp.walk(node, pre_visit=visit)
    return out


def scope_expr(expr: str, matchers: tuple[Matcher, ...]) -> str:
    """`expr` with `matchers` added to every vector selector; the expression itself when there are none.

    PromQLError when the expression does not parse, or when the printed text would not mean the same.
    """
    if not matchers:
        return expr
    tree = parse(expr)
    extra = [(m.name, m.op, m.value) for m in matchers]

    # The parser's transform keeps only freshly parsed replacement nodes, and its printer writes values
    # raw and drops a subquery's empty step. So each leaf is printed with its values escaped once more
    # than the final text needs for every re-parse still above it: once for the final print, once per
    # step-less subquery around it, which is re-parsed with its step written out.
    depth = [1]

    def enter(n: pp.Expr) -> None:
        if isinstance(n, pp.SubqueryExpr) and n.step is None:
            depth[0] += 1

    def rebuild(n: pp.Expr) -> pp.Expr | None:
        if isinstance(n, pp.VectorSelector):
            own = [(m.name, _OPS[str(m.op)], m.value) for m in n.matchers.matchers]
            n.matchers = pp.Matchers([pp.Matcher(_PP_OPS[op], name, _escaped(value, depth[0] + 1))
                                      for name, op, value in own + extra])
            return parse(str(n))
        if isinstance(n, pp.StringLiteral):
            return parse(f'"{_escaped(n.val, depth[0] + 1)}"')
        if isinstance(n, pp.SubqueryExpr) and n.step is None:
            depth[0] -= 1
            n.step = DEFAULT_SUBQUERY_STEP
            return parse(str(n))
        return None

    text = str(pp.transform(tree, pre_visit=enter, post_visit=rebuild))
    wanted = _values(tree)
    wanted = [(w[0], w[1], *sorted(list(w[2:]) + [f"{n}{o}{v}" for n, o, v in extra])) if w[0] == "selector" else w
              for w in wanted]
    try:
        got = _values(parse(text))
    except PromQLError as e:
        raise PromQLError(f"cannot scope {expr!r} to {format_selector(matchers)}: the result does not parse ({e})") from None
    if got != wanted:
        raise PromQLError(f"cannot scope {expr!r} to {format_selector(matchers)}: the printed query would mean "
                          "something else")
    return text
