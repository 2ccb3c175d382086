"""Prometheus alert templates: the subset of Go's text/template that rule files use.

Supported: `{{ $labels.x }}`, `{{ .Labels.x }}`, `{{ $value }}`, `{{ $externalLabels.x }}`,
pipelines (`{{ $value | humanize }}`), function calls with literal arguments
(`{{ printf "%.2f" $value }}`), parentheses, `{{- -}}` trimming, comments, variables
(`{{ $x := ... }}`), `if / else if / else / end`, `with`, `range` over maps and lists, and
Prometheus' template functions (humanize*, printf, toUpper, reReplaceAll, query/first/value/label
when a query function is given, ...). Anything else is a TemplateError naming the construct,
raised when the rule file is loaded, never a silently wrong string.
Values print as Go prints them: `{{ $value }}` of 1e6 is "1e+06", of 0.5 is "0.5".
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Callable

# the variables Prometheus defines before every alert template (rules/alerting.go)
PROMETHEUS_DEFS = ("{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}"
                   "{{$externalURL := .ExternalURL}}{{$value := .Value}}")


class TemplateError(ValueError):
    """A template that does not parse or cannot be expanded; the message says where."""


# -- value formatting as Go's fmt does it --------------------------------------------------------
def go_float(v: float) -> str:
    """Format a float as Go's %v: 0.5 -> '0.5', 1e6 -> '1e+06', 100000.0 -> '100000', nan -> 'NaN'."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign, digits, exp = Decimal(repr(float(v))).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    exp += len("".join(map(str, digits))) - len(ds)  # account for stripped zeros
    nd = len(ds)
    dp = nd + exp  # position of the decimal point relative to the digit string
    x = dp - 1
    s = "-" if sign else ""
    if x < -4 or x >= 6:  # Go's shortest %g switches to %e at precision 6, as %v does
        mant = ds[0] + ("." + ds[1:] if nd > 1 else "")
        return f"{s}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if dp <= 0:
        return f"{s}0.{'0' * -dp}{ds}"
    if dp >= nd:
        return f"{s}{ds}{'0' * (dp - nd)}"
    return f"{s}{ds[:dp]}.{ds[dp:]}"


def go_str(v: Any) -> str:
    """Print a template value as Go's fmt.Fprint would."""
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{go_str(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(go_str(x) for x in v) + "]"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".") + " +0000 UTC"
    return str(v)


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


_VERB_RE = re.compile(r"%([-+# 0]*)(\d+|\*)?(?:\.(\d+|\*))?([a-zA-Z%])")


def go_sprintf(fmt: str, *args: Any) -> str:
    """Go's fmt.Sprintf for the verbs templates use: %s %v %d %f %e %g %x %q %t %%."""
    out: list[str] = []
    pos = 0
    ai = 0
    for m in _VERB_RE.finditer(fmt):
        out.append(fmt[pos:m.start()])
        pos = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%":
            out.append("%")
            continue
        if ai >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        a = args[ai]
        ai += 1
        spec = "%" + flags + (width or "") + (f".{prec}" if prec is not None else "")
        out.append(_format_verb(spec, verb, a, prec))
    out.append(fmt[pos:])
    if ai < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{_go_type(a)}={go_str(a)}" for a in args[ai:]) + ")")
    return "".join(out)


def _go_type(a: Any) -> str:
    return {bool: "bool", int: "int", float: "float64", str: "string"}.get(type(a), "map[string]string")


def _format_verb(spec: str, verb: str, a: Any, prec: str | None) -> str:
    bad = f"%!{verb}({_go_type(a)}={go_str(a)})"
    if verb in "sv":
        return (spec + "s") % go_str(a)
    if verb == "q":
        return '"' + go_str(a).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if verb == "t":
        return go_str(a) if isinstance(a, bool) else bad
    if verb in "dxXob":
        if isinstance(a, bool) or not isinstance(a, int):
            return bad
        return format(a, "b") if verb == "b" else (spec + verb) % a
    if verb in "feEgG":
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            return bad
        v = float(a)
        if math.isnan(v) or math.isinf(v):
            return go_float(v)
        if verb in "gG" and prec is None:
            s = go_float(v)  # Go's %g without precision is the shortest representation
            return s.upper() if verb == "G" else s
        return (spec + verb) % v
    return bad


# -- parsing --------------------------------------------------------------------------------------
@dataclass
class _Node:
    pass


@dataclass
class _Text(_Node):
    text: str


@dataclass
class _Field(_Node):
    base: Any  # "$name", "." or a nested node
    path: list[str]


@dataclass
class _Lit(_Node):
    value: Any


@dataclass
class _Call(_Node):
    name: str
    args: list[_Node]


@dataclass
class _Pipe(_Node):
    cmds: list[list[_Node]]
    decl: str | None = None  # "$x" when the action declares or assigns a variable
    decl2: str | None = None  # second variable of `range $k, $v := ...`


@dataclass
class _Action(_Node):
    pipe: _Pipe


@dataclass
class _Block(_Node):
    kind: str  # if | with | range
    pipe: _Pipe
    body: list[_Node] = field(default_factory=list)
    else_body: list[_Node] = field(default_factory=list)


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

    def pipeline(self, allow_decl: bool = True) -> _Pipe:
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
        return _Pipe(cmds, decl, decl2)

    def command(self) -> list[_Node]:
        items: list[_Node] = []
        while self.peek() and self.peek() not in (("op", "|"), ("op", ")")):
            items.append(self.operand())
        if not items:
            raise TemplateError(f"{self.where}: missing value for command")
        return items

    def operand(self) -> _Node:
        kind, text = self.take()
        if kind == "str":
            return _Lit(re.sub(r"\\(.)", lambda m: _UNESCAPE.get(m.group(1), m.group(1)), text[1:-1]))
        if kind == "raw":
            return _Lit(text[1:-1])
        if kind == "num":
            return _Lit(int(text, 0) if re.fullmatch(r"[-+]?(0[xX][0-9a-fA-F]+|\d+)", text) else float(text))
        if kind == "var":
            name, *path = text.split(".")
            return _Field(name, path)
        if kind == "field":
            return _Field(".", [p for p in text.split(".") if p])
        if kind == "ident":
            if text in ("true", "false"):
                return _Lit(text == "true")
            if text == "nil":
                return _Lit(None)
            if text not in FUNCTIONS:
                raise TemplateError(f'{self.where}: function "{text}" not defined')
            return _Call(text, [])
        if (kind, text) == ("op", "("):
            inner = self.pipeline(allow_decl=False)
            if self.peek() != ("op", ")"):
                raise TemplateError(f"{self.where}: unclosed left paren")
            self.take()
            return _Field(inner, [])
        raise TemplateError(f"{self.where}: unexpected {text!r} in operand")


_ACTION_RE = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


@functools.lru_cache(maxsize=4096)
def parse(text: str, name: str = "template") -> list[_Node]:
    """Parse a template into nodes (cached: rules expand the same text every evaluation).

    TemplateError names the problem (`function "foo" not defined`). Callers must not mutate the result.
    """
    nodes: list[_Node] = []
    stack: list[tuple[_Block, list[_Node]]] = []
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
            cur.append(_Text(chunk))
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
            blk = _Block(head[1], p.pipeline(allow_decl=head[1] != "if"))
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
                nested = _Block("if", p.pipeline(allow_decl=False))
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
            cur.append(_Action(pipe))
    if stack:
        raise TemplateError(f"template: {name}: unexpected EOF (missing {{{{end}}}})")
    tail = text[pos:]
    if trim_next:
        tail = tail.lstrip()
    if "{{" in tail:
        raise TemplateError(f"template: {name}: unclosed action")
    if tail:
        cur.append(_Text(tail))
    return nodes


def _expect_end(p: _Parser, where: str) -> None:
    if p.peek() is not None:
        raise TemplateError(f"{where}: unexpected {p.peek()[1]!r} in command")


# -- evaluation -----------------------------------------------------------------------------------
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
    from vllm_sentinel.agent.alerts.rulefile import parse_duration_ms
    return parse_duration_ms(d) / 1000


def _cmp(a: Any, b: Any) -> tuple[Any, Any]:
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        raise TemplateError(f"incompatible types for comparison")
    return a, b


def _truth(v: Any) -> bool:
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
    "not": lambda a: not _truth(a),
    "and": None,  # short-circuit: handled in _call
    "or": None,
    "query": None,  # needs the evaluator's query function: handled in _call
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


@dataclass
class _Ctx:
    dot: Any
    vars: dict[str, Any]
    query: QueryFunc | None
    external_url: str


def _get_field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, "" if all(isinstance(v, str) for v in obj.values()) else None)
    if isinstance(obj, QuerySample):
        return getattr(obj, name) if name in ("Labels", "Value") else _bad_field(obj, name)
    return _bad_field(obj, name)


def _bad_field(obj: Any, name: str) -> Any:
    raise TemplateError(f"can't evaluate field {name} in type {_go_type(obj)}")


def _eval_operand(node: _Node, ctx: _Ctx, final: Any = None, has_final: bool = False) -> Any:
    if isinstance(node, _Lit):
        return node.value
    if isinstance(node, _Call):
        return _call(node.name, [], ctx, final, has_final)
    if isinstance(node, _Field):
        if isinstance(node.base, _Pipe):
            v = _eval_pipe(node.base, ctx)
        elif node.base == ".":
            v = ctx.dot
        else:
            if node.base not in ctx.vars:
                raise TemplateError(f'undefined variable "{node.base}"')
            v = ctx.vars[node.base]
        for p in node.path:
            v = _get_field(v, p)
        return v
    raise TemplateError(f"cannot evaluate {node!r}")


def _call(name: str, args: list[Any], ctx: _Ctx, final: Any, has_final: bool) -> Any:
    if has_final:
        args = args + [final]
    if name == "query":
        if ctx.query is None:
            raise TemplateError("query is not available here: no query function was given to the expander")
        return ctx.query(*args)
    if name == "externalURL":
        return ctx.external_url
    if name == "pathPrefix":
        m = re.match(r"[a-z]+://[^/]*(/.*)?$", ctx.external_url)
        return (m.group(1) or "") if m else ""
    if name == "and":
        for a in args:
            if not _truth(a):
                return a
        return args[-1]
    if name == "or":
        for a in args:
            if _truth(a):
                return a
        return args[-1]
    try:
        return FUNCTIONS[name](*args)
    except TemplateError:
        raise
    except TypeError as e:
        raise TemplateError(f"wrong number or type of args for {name}: {e}") from None
    except (ValueError, re.error, IndexError, KeyError) as e:
        raise TemplateError(f"error calling {name}: {e}") from None


def _eval_cmd(cmd: list[_Node], ctx: _Ctx, final: Any, has_final: bool) -> Any:
    head = cmd[0]
    if isinstance(head, _Call):
        args = [_eval_operand(a, ctx) for a in cmd[1:]]
        return _call(head.name, args, ctx, final, has_final)
    if len(cmd) > 1 or has_final:
        raise TemplateError(f"can't give argument to non-function {head!r}")
    return _eval_operand(head, ctx)


def _eval_pipe(pipe: _Pipe, ctx: _Ctx) -> Any:
    val: Any = None
    for i, cmd in enumerate(pipe.cmds):
        val = _eval_cmd(cmd, ctx, val, i > 0)
    if pipe.decl and not pipe.decl2:
        ctx.vars[pipe.decl] = val
    return val


def _exec(nodes: list[_Node], ctx: _Ctx, out: list[str]) -> None:
    for n in nodes:
        if isinstance(n, _Text):
            out.append(n.text)
        elif isinstance(n, _Action):
            v = _eval_pipe(n.pipe, ctx)
            if n.pipe.decl is None:
                out.append(go_str(v))
        elif isinstance(n, _Block):
            _exec_block(n, ctx, out)


def _exec_block(n: _Block, ctx: _Ctx, out: list[str]) -> None:
    saved = dict(ctx.vars)
    try:
        if n.kind == "range":
            v = _eval_pipe(_Pipe(n.pipe.cmds), ctx)
            items = sorted(v.items()) if isinstance(v, dict) else list(enumerate(v or []))
            if not items:
                _exec(n.else_body, ctx, out)
            for k, item in items:
                if n.pipe.decl2:
                    ctx.vars[n.pipe.decl], ctx.vars[n.pipe.decl2] = k, item
                elif n.pipe.decl:
                    ctx.vars[n.pipe.decl] = item
                dot, ctx.dot = ctx.dot, item
                _exec(n.body, ctx, out)
                ctx.dot = dot
            return
        v = _eval_pipe(n.pipe, ctx)
        if _truth(v):
            if n.kind == "with":
                dot, ctx.dot = ctx.dot, v
                _exec(n.body, ctx, out)
                ctx.dot = dot
            else:
                _exec(n.body, ctx, out)
        else:
            _exec(n.else_body, ctx, out)
    finally:
        # variables declared inside a block do not outlive it (Go scoping)
        ctx.vars = {k: ctx.vars.get(k, v) for k, v in saved.items()}


def expand_alert_template(text: str, labels: dict[str, str], value: float,
                          external_labels: dict[str, str] | None = None, external_url: str = "",
                          query: QueryFunc | None = None, name: str = "alert") -> str:
    """Expand `text` as Prometheus does for alert labels and annotations.

    'x {{ $labels.instance }} {{ $value | humanize }}' with labels {'instance': 'a'} and value
    0.3333 -> 'x a 333.3m'.
    """
    nodes = parse(PROMETHEUS_DEFS + text, f"__alert_{name}")
    data = {"Labels": labels, "ExternalLabels": external_labels or {}, "ExternalURL": external_url,
            "Value": value}
    ctx = _Ctx(dot=data, vars={"$": data}, query=query, external_url=external_url)
    out: list[str] = []
    try:
        _exec(nodes, ctx, out)
    except RecursionError:
        raise TemplateError("template too deeply nested") from None
    return "".join(out)


def check_template(text: str, name: str = "alert") -> None:
    """Raise TemplateError when `text` would not parse as an alert template."""
    parse(PROMETHEUS_DEFS + text, f"__alert_{name}")
