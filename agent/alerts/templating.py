"""Prometheus alert templates: parsed (agent/alerts/template_parser.py) and expanded against an alert.

Prometheus' template functions are in agent/alerts/template_functions.py. A template that does not
parse is a TemplateError raised when the rule file is loaded, never a silently wrong string.
Values print as Go prints them: `{{ $value }}` of 1e6 is "1e+06", of 0.5 is "0.5".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.alerts.gofmt import go_str, go_type
from vllm_sentinel.agent.alerts.template_functions import FUNCTIONS, QueryFunc, QuerySample, TemplateError, truth
from vllm_sentinel.agent.alerts.template_parser import (ActionNode, BlockNode, CallNode, FieldNode, LitNode, Node,
                                                        PipeNode, TextNode, parse)

# the variables Prometheus defines before every alert template (rules/alerting.go)
PROMETHEUS_DEFS = ("{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}"
                   "{{$externalURL := .ExternalURL}}{{$value := .Value}}")


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
    raise TemplateError(f"can't evaluate field {name} in type {go_type(obj)}")


def _eval_operand(node: Node, ctx: _Ctx, final: Any = None, has_final: bool = False) -> Any:
    if isinstance(node, LitNode):
        return node.value
    if isinstance(node, CallNode):
        return _call(node.name, [], ctx, final, has_final)
    if isinstance(node, FieldNode):
        if isinstance(node.base, PipeNode):
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
            if not truth(a):
                return a
        return args[-1]
    if name == "or":
        for a in args:
            if truth(a):
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


def _eval_cmd(cmd: list[Node], ctx: _Ctx, final: Any, has_final: bool) -> Any:
    head = cmd[0]
    if isinstance(head, CallNode):
        args = [_eval_operand(a, ctx) for a in cmd[1:]]
        return _call(head.name, args, ctx, final, has_final)
    if len(cmd) > 1 or has_final:
        raise TemplateError(f"can't give argument to non-function {head!r}")
    return _eval_operand(head, ctx)


def _eval_pipe(pipe: PipeNode, ctx: _Ctx) -> Any:
    val: Any = None
    for i, cmd in enumerate(pipe.cmds):
        val = _eval_cmd(cmd, ctx, val, i > 0)
    if pipe.decl and not pipe.decl2:
        ctx.vars[pipe.decl] = val
    return val


def _exec(nodes: list[Node], ctx: _Ctx, out: list[str]) -> None:
    for n in nodes:
        if isinstance(n, TextNode):
            out.append(n.text)
        elif isinstance(n, ActionNode):
            v = _eval_pipe(n.pipe, ctx)
            if n.pipe.decl is None:
                out.append(go_str(v))
        elif isinstance(n, BlockNode):
            _exec_block(n, ctx, out)


def _exec_block(n: BlockNode, ctx: _Ctx, out: list[str]) -> None:
    saved = dict(ctx.vars)
    try:
        if n.kind == "range":
            v = _eval_pipe(PipeNode(n.pipe.cmds), ctx)
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
        if truth(v):
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
