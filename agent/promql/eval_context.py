"""What an evaluation carries from node to node: its grid of steps and its cursor; parentheses seen through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import promql_parser as pp


def unwrap(node: pp.Expr) -> pp.Expr:
    """The expression inside any parentheses around it."""
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def is_string(node: pp.Expr) -> bool:
    """A string literal, parentheses aside: the one operand a binary operator refuses even beside nothing."""
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return isinstance(node, pp.StringLiteral)


@dataclass
class Grid:
    """Evaluation times of one query: t_ms[i] for step i."""

    t_ms: np.ndarray  # int64

    @property
    def n(self) -> int:
        """Number of steps."""
        return len(self.t_ms)


class EvalContext:
    """One evaluation: its engine, its store cursor and its grid of steps."""

    def __init__(self, engine: Any, cur, grid: Grid):
        self.engine = engine
        self.cur = cur
        self.grid = grid
