"""Adding label matchers to every series selector of a PromQL expression (dashboard variables, scoping).

    with_matchers('sum(rate(vllm:x_total[1m]))', lambda metric: ['instance=~"$instance"'])
      -> 'sum(rate(vllm:x_total{instance=~"$instance"}[1m]))'

The expression is parsed and printed back in promql-parser's canonical form; each selector in
that text is then extended. The result is parsed again and checked: the same selectors, each
with the added matchers (a label it already matches on is left as written), or PromQLError.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import promql_parser as pp

from vllm_sentinel.agent.promql.parser import PromQLError, matchers_of, parse


def selectors(node: object) -> list[pp.VectorSelector]:
    """Every vector selector of an expression, matrix and subquery ones included, in order."""
    out: list[pp.VectorSelector] = []

    def walk(n: object) -> None:
        if isinstance(n, pp.VectorSelector):
            out.append(n)
            return
        if isinstance(n, pp.MatrixSelector):
            walk(n.vector_selector)
            return
        for attr in ("expr", "lhs", "rhs", "param"):
            child = getattr(n, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for arg in getattr(n, "args", None) or []:  # a call's arguments
            walk(arg)

    walk(node)
    return out


# promql-parser's printer: prettify() is faithful (str() drops the ':' of `[10m:]`) but writes a
# selector without matchers as a bare name; the scan below tells such a name from a function or a
# label by what surrounds it, skipping strings, ranges and label lists.
_TOKENS = re.compile(r"""
    "(?:[^"\\]|\\.)*" | '(?:[^'\\]|\\.)*' | `[^`]*`         # string literals
  | \[[^\]]*\]                                                # ranges, subquery ranges
  | \{(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^}"'])*\}     # a selector's matchers
  | \b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)   # label lists
  | [a-zA-Z_:][a-zA-Z0-9_:]*                                     # names
""", re.VERBOSE)


def with_matchers(expr: str, extra: Callable[[str], list[str]]) -> str:
    """`expr` with `extra(metric)` matchers (PromQL text like 'instance=~"$i"') added to each selector."""
    tree = parse(expr)
    names = {sel.name for sel in selectors(tree)}
    text = tree.prettify()
    out: list[str] = []
    pos = 0
    tokens = list(_TOKENS.finditer(text))
    for i, tok in enumerate(tokens):
        word = tok.group(0)
        after = text[tok.end():].lstrip()
        if word in names and not after.startswith("("):
            follows = tokens[i + 1] if i + 1 < len(tokens) else None
            braces = follows is not None and follows.start() == tok.end() and follows.group(0).startswith("{")
            added = extra(word)
            if not braces and added:
                out.append(text[pos:tok.end()] + "{" + ", ".join(added) + "}")
                pos = tok.end()
        elif word.startswith("{"):
            name = text[:tok.start()].rstrip()
            metric = _trailing_name(text[:tok.start()])
            sel = metric if metric in names else ""
            if sel or not name or not name[-1].isalnum():
                inner = word[1:-1].strip()
                present = _labels_in(inner)
                added = [m for m in extra(sel) if _label_of(m) not in present]
                out.append(text[pos:tok.start()] + "{" + ", ".join(([inner] if inner else []) + added) + "}")
                pos = tok.end()
    out.append(text[pos:])
    rewritten = "".join(out)
    _check(expr, rewritten, extra)
    return rewritten


def _trailing_name(text: str) -> str:
    m = re.search(r"[a-zA-Z_:][a-zA-Z0-9_:]*$", text)
    return m.group(0) if m else ""


def _label_of(matcher: str) -> str:
    return re.split(r"\s*(?:=~|!~|!=|=)", matcher, maxsplit=1)[0].strip()


def _labels_in(inner: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", inner)}


def _check(original: str, rewritten: str, extra: Callable[[str], list[str]]) -> None:
    """The rewrite kept every selector and gave each its matchers; anything else is a bug, said as one."""
    before, after = selectors(parse(original)), selectors(parse(rewritten))
    if [s.name for s in before] != [s.name for s in after]:
        raise PromQLError(f"adding matchers changed the selectors of {original!r}")
    for sel in after:
        labels = {label for label, _op, _v in matchers_of(sel)}
        for m in extra(sel.name or ""):
            if _label_of(m) not in labels:
                raise PromQLError(f"could not add {m} to {sel} in {original!r}")
