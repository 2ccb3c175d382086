"""The template parser: the subset of Go's text/template that rule files use, into a tree of nodes.

Supported: `{{ $labels.x }}`, `{{ .Labels.x }}`, pipelines (`{{ $value | humanize }}`), function
calls with literal arguments, parentheses, `{{- -}}` trimming, comments, variables
(`{{ $x := ... }}`), `if / else if / else / end`, `with` and `range`. Anything else is a
TemplateError naming the construct.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from vllm_sentinel.agent.alerts.template_functions import FUNCTIONS, TemplateError


@dataclass
class Node:
    """A node of a parsed template."""


@dataclass
class TextNode(Node):
    """Literal text between actions."""

    text: str


@dataclass
class FieldNode(Node):
    """A variable, `.` or a parenthesised pipeline, followed by field names (`$labels.instance`)."""

    base: Any  # "$name", "." or a nested node
    path: list[str]


@dataclass
class LitNode(Node):
    """A constant: string, number, bool or nil."""

    value: Any


@dataclass
class CallNode(Node):
    """A template function by name; its arguments are the rest of the command."""

    name: str
    args: list[Node]


@dataclass
class PipeNode(Node):
    """Commands joined by `|`, optionally declaring variables."""

    cmds: list[list[Node]]
    decl: str | None = None  # "$x" when the action declares or assigns a variable
    decl2: str | None = None  # second variable of `range $k, $v := ...`


@dataclass
class ActionNode(Node):
    """`{{ pipeline }}`: prints its value unless it declares a variable."""

    pipe: PipeNode


@dataclass
class BlockNode(Node):
    """`if`, `with` or `range`, with its body and else branch."""

    kind: str  # if | with | range
    pipe: PipeNode
    body: list[Node] = field(default_factory=list)
    else_body: list[Node] = field(default_factory=list)


_TOKEN_RE = re.compile(r"""
    \s+ |
    (?P<str>"(?:[^"\\]|\\.)*") | (?P<raw>`[^`]*`) |
    (?P<num>[-+]?(?:0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)) |
    (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*) |
    (?P<field>(?:\.[A-Za-z0-9_]+)+|\.) |
    (?P<ident>[A-Za-z_][A-Za-z0-9_]*) |
    (?P<op>:=|=|\||\(|\)|,)
""", re.X)


def _tokens(src: str, where: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(src):
        m = _TOKEN_RE.match(src, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"{where}: unexpected {src[pos:pos + 10]!r} in action")
        pos = m.end()
        if m.lastgroup:
            out.append((m.lastgroup, m.group(m.lastgroup)))
    return out


_UNESCAPE = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "r": "\r"}


class _Parser:
    def __init__(self, toks: list[tuple[str, str]], where: str):
        self.toks, self.i, self.where = toks, 0, where

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        t = self.toks[self.i]
        self.i += 1
        return t

    def pipeline(self, allow_decl: bool = True) -> PipeNode:
        decl = decl2 = None
        if allow_decl and self.peek() and self.peek()[0] == "var":
            # `$x := ...`, `$x = ...` or `$k, $v := ...`
            j = self.i
            if j + 1 < len(self.toks) and self.toks[j + 1] in (("op", ":="), ("op", "=")):
                decl = self.toks[j][1]
                self.i += 2
            elif (j + 3 < len(self.toks) and self.toks[j + 1] == ("op", ",")
                  and self.toks[j + 2][0] == "var" and self.toks[j + 3] == ("op", ":=")):
                decl, decl2 = self.toks[j][1], self.toks[j + 2][1]
                self.i += 4
        cmds = [self.command()]
        while self.peek() == ("op", "|"):
            self.take()
            cmds.append(self.command())
        return PipeNode(cmds, decl, decl2)

    def command(self) -> list[Node]:
        items: list[Node] = []
        while self.peek() and self.peek() not in (("op", "|"), ("op", ")")):
            items.append(self.operand())
        if not items:
            raise TemplateError(f"{self.where}: missing value for command")
        return items

    def operand(self) -> Node:
        kind, text = self.take()
        if kind == "str":
            return LitNode(re.sub(r"\\(.)", lambda m: _UNESCAPE.get(m.group(1), m.group(1)), text[1:-1]))
        if kind == "raw":
            return LitNode(text[1:-1])
        if kind == "num":
            return LitNode(int(text, 0) if re.fullmatch(r"[-+]?(0[xX][0-9a-fA-F]+|\d+)", text) else float(text))
        if kind == "var":
            name, *path = text.split(".")
            return FieldNode(name, path)
        if kind == "field":
            return FieldNode(".", [p for p in text.split(".") if p])
        if kind == "ident":
            if text in ("true", "false"):
                return LitNode(text == "true")
            if text == "nil":
                return LitNode(None)
            if text not in FUNCTIONS:
                raise TemplateError(f'{self.where}: function "{text}" not defined')
            return CallNode(text, [])
        if (kind, text) == ("op", "("):
            inner = self.pipeline(allow_decl=False)
            if self.peek() != ("op", ")"):
                raise TemplateError(f"{self.where}: unclosed left paren")
            self.take()
            return FieldNode(inner, [])
        raise TemplateError(f"{self.where}: unexpected {text!r} in operand")


_ACTION_RE = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


@functools.lru_cache(maxsize=4096)
def parse(text: str, name: str = "template") -> list[Node]:
    """Parse a template into nodes (cached: rules expand the same text every evaluation).

    TemplateError names the problem (`function "foo" not defined`). Callers must not mutate the result.
    """
    nodes: list[Node] = []
    stack: list[tuple[BlockNode, list[Node]]] = []
    cur = nodes
    pos = 0
    trim_next = False
    for m in _ACTION_RE.finditer(text):
        chunk = text[pos:m.start()]
        if trim_next:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        if chunk:
            cur.append(TextNode(chunk))
        pos = m.end()
        trim_next = bool(m.group(3))
        body = m.group(2).strip()
        where = f"template: {name}"
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError(f"{where}: unclosed comment")
            continue
        toks = _tokens(body, where)
        if not toks:
            raise TemplateError(f"{where}: missing value for command")
        head = toks[0]
        if head[0] == "ident" and head[1] in ("if", "with", "range"):
            p = _Parser(toks[1:], where)
            blk = BlockNode(head[1], p.pipeline(allow_decl=head[1] != "if"))
            _expect_end(p, where)
            cur.append(blk)
            stack.append((blk, cur))
            cur = blk.body
        elif head == ("ident", "else"):
            if not stack:
                raise TemplateError(f"{where}: unexpected {{{{else}}}}")
            blk, parent = stack[-1]
            if cur is blk.else_body:
                raise TemplateError(f"{where}: expected end; found {{{{else}}}}")
            if len(toks) > 1 and toks[1] == ("ident", "if"):
                # `else if x` is `else` + nested `if x` closed by the same `end`
                p = _Parser(toks[2:], where)
                nested = BlockNode("if", p.pipeline(allow_decl=False))
                _expect_end(p, where)
                blk.else_body.append(nested)
                stack[-1] = (nested, parent)  # the shared `end` closes both
                cur = nested.body
            else:
                cur = blk.else_body
        elif head == ("ident", "end"):
            if not stack:
                raise TemplateError(f"{where}: unexpected {{{{end}}}}")
            _, cur = stack.pop()
        elif head[0] == "ident" and head[1] in ("define", "template", "block", "break", "continue"):
            raise TemplateError(f"{where}: {{{{{head[1]}}}}} is not supported in vllm-sentinel templates")
        else:
            p = _Parser(toks, where)
            pipe = p.pipeline()
            _expect_end(p, where)
            cur.append(ActionNode(pipe))
    if stack:
        raise TemplateError(f"template: {name}: unexpected EOF (missing {{{{end}}}})")
    tail = text[pos:]
    if trim_next:
        tail = tail.lstrip()
    if "{{" in tail:
        raise TemplateError(f"template: {name}: unclosed action")
    if tail:
        cur.append(TextNode(tail))
    return nodes


def _expect_end(p: _Parser, where: str) -> None:
    if p.peek() is not None:
        raise TemplateError(f"{where}: unexpected {p.peek()[1]!r} in command")
