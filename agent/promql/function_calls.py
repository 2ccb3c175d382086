"""The engine's function calls other than range functions: time(), vector(), scalar(), math, clamp, round,
timestamp(), absent(), histogram_quantile(), label_replace(), and their arguments' types checked."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql import functions as fn
from vllm_sentinel.agent.promql.eval_context import EvalContext, unwrap
from vllm_sentinel.agent.promql.histograms import histogram_quantile
from vllm_sentinel.agent.promql.label_functions import absent_labels, label_replace
from vllm_sentinel.agent.promql.parser import PromQLError, Unsupported
from vllm_sentinel.agent.promql.range_calls import RANGE_FUNCS
from vllm_sentinel.agent.promql.vectors import Str, Vec, dedupe, drop_names


class FunctionCalls:
    """Engine's function calls (a mixin of engine.Engine)."""

    # NodeEval's and RangeCalls'
    _eval: Callable[[pp.Expr, EvalContext], object]
    _range_function: Callable[[str, list, EvalContext], Vec]

    def _call(self, node: pp.Call, ctx: EvalContext):
        name = node.func.name
        n = ctx.grid.n
        args = list(node.args)
        if name in RANGE_FUNCS:
            return self._range_function(name, args, ctx)
        if name == "time":
            return ctx.grid.t_ms.astype(np.float64) / 1000
        if name == "pi":
            return np.full(n, math.pi)
        if name == "vector":
            s = self._scalar_arg(args[0], ctx, name)
            return Vec([()], s.reshape(1, n).copy(), np.ones((1, n), dtype=bool))
        if name == "scalar":
            vec = self._vector_arg(args[0], ctx, name)
            count = vec.ok.sum(axis=0)
            vals = np.where(vec.ok, vec.v, 0.0).sum(axis=0) if len(vec.keys) else np.zeros(n)
            return np.where(count == 1, vals, math.nan)
        if name in fn.SIMPLE_MATH:
            vec = self._vector_arg(args[0], ctx, name)
            with np.errstate(all="ignore"):
                out = fn.SIMPLE_MATH[name](vec.v)
            return dedupe(Vec(drop_names(vec.keys), out, vec.ok), whole_series=False)
        if name in ("clamp", "clamp_min", "clamp_max"):
            vec = self._vector_arg(args[0], ctx, name)
            ok = vec.ok.copy()
            with np.errstate(all="ignore"):
                if name == "clamp":
                    lo, hi = self._scalar_arg(args[1], ctx, name), self._scalar_arg(args[2], ctx, name)
                    out = np.maximum(lo, np.minimum(hi, vec.v))
                    ok &= ~(hi < lo)
                elif name == "clamp_min":
                    out = np.maximum(self._scalar_arg(args[1], ctx, name), vec.v)
                else:
                    out = np.minimum(self._scalar_arg(args[1], ctx, name), vec.v)
            return dedupe(Vec(drop_names(vec.keys), out, ok), whole_series=False)
        if name == "round":
            vec = self._vector_arg(args[0], ctx, name)
            to = self._scalar_arg(args[1], ctx, name) if len(args) > 1 else np.ones(n)
            return dedupe(Vec(drop_names(vec.keys), fn.go_round(vec.v, to), vec.ok),
                           whole_series=False)
        if name in ("sort", "sort_desc"):
            return self._vector_arg(args[0], ctx, name)  # results are returned sorted by labels anyway
        if name == "timestamp":
            arg = unwrap(args[0])
            vec = self._vector_arg(arg, ctx, name)
            if isinstance(arg, pp.VectorSelector) and vec.ts is not None:
                out = vec.ts.astype(np.float64) / 1000
            else:
                out = np.broadcast_to(ctx.grid.t_ms.astype(np.float64) / 1000, vec.v.shape).copy()
            return dedupe(Vec(drop_names(vec.keys), out, vec.ok), whole_series=False)
        if name == "absent":
            vec = self._vector_arg(args[0], ctx, name)
            missing = ~vec.ok.any(axis=0) if len(vec.keys) else np.ones(n, dtype=bool)
            return Vec([absent_labels(args[0])], np.ones((1, n)), missing.reshape(1, n))
        if name == "histogram_quantile":
            q = self._scalar_arg(args[0], ctx, name)
            return histogram_quantile(q, self._vector_arg(args[1], ctx, name))
        if name == "label_replace":
            return label_replace(self._vector_arg(args[0], ctx, name),
                                  *[self._string_arg(a, ctx, name) for a in args[1:5]])
        raise Unsupported(f"unsupported: function {name}")

    def _vector_arg(self, node: pp.Expr, ctx: EvalContext, fname: str) -> Vec:
        val = self._eval(node, ctx)
        if not isinstance(val, Vec):
            raise PromQLError(f"{fname}(): expected an instant vector argument")
        return val

    def _scalar_arg(self, node: pp.Expr, ctx: EvalContext, fname: str) -> np.ndarray:
        val = self._eval(node, ctx)
        if not isinstance(val, np.ndarray):
            raise PromQLError(f"{fname}(): expected a scalar argument")
        return val

    def _string_arg(self, node: pp.Expr, ctx: EvalContext, fname: str) -> str:
        val = self._eval(node, ctx)
        if not isinstance(val, Str):
            raise PromQLError(f"{fname}(): expected a string argument")
        return val.value
