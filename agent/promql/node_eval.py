"""The engine's dispatch over expression nodes, with its binary operators and aggregations."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import promql_parser as pp

from vllm_sentinel.agent.promql.aggregation import aggregate, order_sensitive
from vllm_sentinel.agent.promql.binary_ops import COMPARISON, SET_OPS, elem_binop, set_op, vector_binop, vector_scalar
from vllm_sentinel.agent.promql.eval_context import EvalContext, is_string
from vllm_sentinel.agent.promql.parser import PromQLError, Unsupported, op_name
from vllm_sentinel.agent.promql.vectors import Str, Vec, dedupe, drop_names


class NodeEval:
    """Engine's evaluation of a node (a mixin of engine.Engine, whose __init__ sets the fields below)."""

    _check_order: bool
    _order_sensitive: bool
    # SelectorEval's and FunctionCalls'
    _vector_selector: Callable[[pp.VectorSelector, EvalContext], Vec]
    _call: Callable[[pp.Call, EvalContext], object]

    def _eval(self, node: pp.Expr, ctx: EvalContext):
        n = ctx.grid.n
        if isinstance(node, pp.ParenExpr):
            return self._eval(node.expr, ctx)
        if isinstance(node, pp.NumberLiteral):
            return np.full(n, float(node.val))
        if isinstance(node, pp.StringLiteral):
            return Str(node.val)
        if isinstance(node, pp.VectorSelector):
            return self._vector_selector(node, ctx)
        if isinstance(node, pp.MatrixSelector):
            raise PromQLError("a range vector (matrix selector) is only valid as a function argument "
                              "or as a whole instant query")
        if isinstance(node, pp.SubqueryExpr):
            raise Unsupported("unsupported: subquery")
        if isinstance(node, pp.UnaryExpr):
            val = self._eval(node.expr, ctx)
            if isinstance(val, np.ndarray):
                return -val
            return dedupe(Vec(drop_names(val.keys), -val.v, val.ok), whole_series=True)
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node, ctx)
        if isinstance(node, pp.AggregateExpr):
            return self._aggregate(node, ctx)
        if isinstance(node, pp.Call):
            return self._call(node, ctx)
        raise Unsupported(f"unsupported: expression {type(node).__name__}")


    def _binary(self, node: pp.BinaryExpr, ctx: EvalContext):
        op = op_name(node.op)
        mod = node.modifier
        return_bool = bool(mod.return_bool) if mod is not None else False
        lhs = self._eval(node.lhs, ctx)
        if op != "or" and isinstance(lhs, Vec) and not lhs.ok.any() and not is_string(node.rhs):
            # every operator but `or` keeps only left-hand series (or right-hand ones matched to one): an
            # empty left side gives an empty result whatever the right side holds. Most alert rules read
            # `condition and on (...) more conditions`; while the first finds nothing (a healthy fleet) the
            # rest, often the costliest windows (a 10-minute baseline), are not evaluated.
            return Vec.empty(ctx.grid.n)
        rhs = self._eval(node.rhs, ctx)
        if isinstance(lhs, Str) or isinstance(rhs, Str):
            raise PromQLError(f"binary operator {op} is not defined on strings")
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            value, keep = elem_binop(op, lhs, rhs)
            if op in COMPARISON:
                return keep.astype(np.float64)
            return value
        if isinstance(lhs, Vec) and isinstance(rhs, np.ndarray):
            return vector_scalar(op, lhs, rhs, swap=False, return_bool=return_bool)
        if isinstance(lhs, np.ndarray) and isinstance(rhs, Vec):
            return vector_scalar(op, rhs, lhs, swap=True, return_bool=return_bool)
        on, names, include = False, [], []
        card = pp.VectorMatchCardinality.OneToOne
        if mod is not None:
            card = mod.card
            if mod.matching is not None:
                on = mod.matching.type == pp.LabelModifierType.Include
                names = list(mod.matching.labels)
            include = list(mod.group_labels or [])
        if op in SET_OPS:
            return set_op(op, lhs, rhs, on, names)
        return vector_binop(op, lhs, rhs, card, on, names, include, return_bool)

    def _aggregate(self, node: pp.AggregateExpr, ctx: EvalContext):
        op = op_name(node.op)
        if op == "count_values":
            raise Unsupported("unsupported: aggregation count_values")
        vec = self._eval(node.expr, ctx)
        if not isinstance(vec, Vec):
            raise PromQLError(f"expected an instant vector in aggregation {op}")
        param = self._eval(node.param, ctx) if node.param is not None else None
        without = False
        grouping: list[str] = []
        if node.modifier is not None:
            without = node.modifier.type == pp.AggModifierType.Without
            grouping = list(node.modifier.labels)
        if self._check_order and order_sensitive(op, vec, grouping, without, param, ctx.grid.n):
            self._order_sensitive = True
        return aggregate(op, vec, param, grouping, without, ctx.grid.n)
