"""PromQL answered by a remote Prometheus: the local Engine's interface, so every command can read a fleet.

`RemoteEngine` offers what `Engine` offers (`instant(expr, t_ms)`, `range(expr, start, end, step)`)
plus the batched forms a remote source wants (`instant_many`, `range_many`: many queries at once,
concurrently, each range split under Prometheus' points limit). Every expression is scoped to the
engine's selector first (agent/promql/scope.py). Code that evaluates PromQL takes "an engine" and
calls `range_all`/`instant_all`, so it runs unchanged over the DuckDB store or a Prometheus:

    engine = RemoteEngine(PrometheusClient(PrometheusConnection(url)), parse_selector('{job="vllm"}'))
    [waiting, running] = range_all(engine, [("vllm:num_requests_waiting", s, e, 5000),
                                            ("vllm:num_requests_running", s, e, 5000)])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.promql.scope import Matcher, format_selector, scope_expr
from vllm_sentinel.collectors.prometheus import InstantSample, PrometheusClient, PrometheusQueryError, RangeSeries

RangeQuery = tuple[str, int, int, int]  # (expr, start_ms, end_ms, step_ms)
InstantQuery = tuple[str, int]  # (expr, t_ms)


class QueryEngine(Protocol):
    """What evaluating code needs from a PromQL source (the local Engine and RemoteEngine both are one)."""

    def instant(self, expr: str, t_ms: int) -> Any:
        """An instant query: a list of samples (.labels, .value) or a float."""

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[Any]:
        """A range query: series with .labels and .points [(t_ms, value)]."""


def range_all(engine: Any, queries: Sequence[RangeQuery]) -> list[list[Any]]:
    """Every range query's result, in order; at once where the engine can (a remote one), else one by one."""
    many = getattr(engine, "range_many", None)
    return many(list(queries)) if many is not None else [engine.range(*q) for q in queries]


def instant_all(engine: Any, queries: Sequence[InstantQuery]) -> list[Any]:
    """Every instant query's result, in order; at once where the engine can, else one by one."""
    many = getattr(engine, "instant_many", None)
    return many(list(queries)) if many is not None else [engine.instant(*q) for q in queries]


class RemoteQueryError(PromQLError):
    """Prometheus refused one query (as the local engine's PromQLError: that query fails, not the source)."""


class RemoteEngine:
    """Instant and range queries sent to one Prometheus, each expression scoped to `selector` first.

    A query Prometheus refuses (HTTP 400/422) raises RemoteQueryError, a PromQLError like the local
    engine's; an unreachable or failing server raises PrometheusError, which ends the command.
    """

    def __init__(self, client: PrometheusClient, selector: tuple[Matcher, ...] = ()):
        self.client = client
        self.selector = tuple(selector)
        self._scoped: dict[str, str] = {}

    @property
    def source(self) -> str:
        """'prometheus:URL' (with the selector when there is one): the diagnose document's `source`."""
        return f"prometheus:{self.client.url}" + (f" {format_selector(self.selector)}" if self.selector else "")

    def scoped(self, expr: str) -> str:
        """The expression as sent: every vector selector scoped (PromQLError when it cannot be)."""
        out = self._scoped.get(expr)
        if out is None:
            out = self._scoped[expr] = scope_expr(expr, self.selector)
        return out

    def instant(self, expr: str, t_ms: int) -> list[InstantSample] | float:
        """An instant query at t_ms."""
        return self.instant_many([(expr, t_ms)])[0]

    def range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[RangeSeries]:
        """A range query, split under the points limit."""
        return self.range_many([(expr, start_ms, end_ms, step_ms)])[0]

    def range_many(self, queries: list[RangeQuery]) -> list[list[RangeSeries]]:
        """Several range queries at once (bounded concurrency)."""
        scoped = [(self.scoped(e), s, t, st) for e, s, t, st in queries]
        try:
            return self.client.query_ranges(scoped)
        except PrometheusQueryError as e:
            raise RemoteQueryError(str(e)) from None

    def instant_many(self, queries: list[InstantQuery]) -> list[list[InstantSample] | float]:
        """Several instant queries at once (bounded concurrency)."""
        scoped = [(self.scoped(e), t) for e, t in queries]
        try:
            return self.client.queries(scoped)
        except PrometheusQueryError as e:
            raise RemoteQueryError(str(e)) from None

    def label_values(self, label: str, metric_regex: str, start_ms: int, end_ms: int) -> list[str]:
        """Values of `label` on in-scope series whose name matches `metric_regex`, in [start_ms, end_ms]."""
        match = self.scoped(f'{{__name__=~"{metric_regex}"}}')
        return self.client.label_values(label, [match], start_ms, end_ms)
