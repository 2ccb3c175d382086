"""Recording rules over a past window, for data the sidecar never evaluated (an ingested dump).

`diagnose` replays alerting rules over history. When an alert reads a recording rule's series
that the store does not hold, the metrics the rules read are copied for the window into an
in-memory store, the recording rules are evaluated there as range queries in group order (each
one's output, with Prometheus' staleness markers, visible to the next), and the alerts run on
that copy. Only the metrics the rules name are copied, so a window of a busy store stays small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import promql_parser as pp

from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleGroup
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.sample_reads import samples_of_metrics
from vllm_sentinel.agent.store.series_table import metrics_present
from vllm_sentinel.collectors.base import Batch, format_labels

LOOKBACK_MS = 300_000


def _ms(td: Any) -> int:
    return int(td.total_seconds() * 1000) if td is not None else 0


def referenced(exprs: list[str]) -> tuple[set[str] | None, int]:
    """Metric names the expressions read (None when a selector has no fixed name) and how far back
    they reach in ms (longest range + offset, plus the 5-minute lookback)."""
    names: set[str] | None = set()
    reach = 0

    def visit(node: Any) -> None:
        nonlocal names, reach
        if isinstance(node, pp.MatrixSelector):
            sel = node.vector_selector
            reach = max(reach, _ms(node.range) + _ms(sel.offset))
        elif isinstance(node, pp.SubqueryExpr):
            reach = max(reach, _ms(node.range) + _ms(node.offset))
        elif isinstance(node, pp.VectorSelector):
            reach = max(reach, _ms(node.offset))
            name = node.name or next((m.value for m in node.matchers.matchers
                                      if m.name == "__name__" and str(m.op) == "MatchOp.Equal"), None)
            if name is None:
                names = None
            elif names is not None:
                names.add(name)

    for e in exprs:
        pp.walk(pp.parse(e), visit)
    return names, reach + LOOKBACK_MS


def _alert_exprs(groups: list[RuleGroup]) -> list[str]:
    return [x for g in groups for r in g.rules if r.is_alert for x in [r.expr, *(e.expr for e in r.evidence)]]


def needs_replay(store: Any, groups: list[RuleGroup]) -> bool:
    """True when an alert reads a recorded series that the store does not hold."""
    recorded = {r.name for g in groups for r in g.rules if not r.is_alert}
    if not recorded:
        return False
    names, _ = referenced(_alert_exprs(groups))
    wanted = recorded if names is None else recorded & names
    if not wanted:
        return False
    return bool(wanted - metrics_present(store, wanted))


def replay_store(store: Any, groups: list[RuleGroup], first_ms: int, end_ms: int, step_ms: int,
                 engine_factory: Callable[[Any], Any]) -> Store:
    """An in-memory store with the rules' input metrics around [first_ms, end_ms] and the recording
    rules' output on the step grid, ready for the alerting rules."""
    recording = [r for g in groups for r in g.rules if not r.is_alert]
    recorded = {r.name for r in recording}
    _, alert_reach = referenced(_alert_exprs(groups))
    rec_names, rec_reach = referenced([r.expr for r in recording])
    alert_names, _ = referenced(_alert_exprs(groups))
    names = None if rec_names is None or alert_names is None else (rec_names | alert_names) - recorded
    rec_first = first_ms - ((alert_reach + step_ms - 1) // step_ms) * step_ms
    mem = Store.open(":memory:")
    try:
        _copy(store, mem, names, rec_first - rec_reach, end_ms)
        engine = engine_factory(mem)
        for rule in recording:
            _record(mem, engine, rule, rec_first, end_ms, step_ms)
    except BaseException:
        mem.close()
        raise
    return mem


def _copy(src: Any, dst: Store, names: set[str] | None, lo: int, hi: int) -> None:
    if names is not None and not names:
        return
    table = samples_of_metrics(src, names, lo, hi)
    ts, inst, metric, text, value = (table[c].tolist() for c in ("ts", "instance", "metric", "labels_text", "value"))
    batches: dict[str, Batch] = {}
    for i, instance in enumerate(inst):
        b = batches.get(instance)
        if b is None:
            b = batches[instance] = Batch(instance=instance, ts_ms=lo)
        b.metrics.append(metric[i])
        b.labels.append(text[i])
        b.values.append(value[i])
        b.timestamps_ms.append(ts[i])
    if batches:
        dst.append_many(list(batches.values()))


def _record(mem: Store, engine: Any, rule: Rule, first: int, end: int, step: int) -> None:
    """Evaluate one recording rule over the grid and append its output, with staleness markers
    at the first step a series is gone (as Prometheus' rule group writes them)."""
    batches: dict[str, Batch] = {}
    for s in engine.range(rule.expr, first, end, step):
        labels = {k: v for k, v in {**s.labels, **rule.labels}.items() if v != "" and k != "__name__"}
        instance = labels.pop("instance", "")
        b = batches.get(instance)
        if b is None:
            b = batches[instance] = Batch(instance=instance, ts_ms=first)
        text = format_labels(labels)
        prev = None
        for t, v in s.points:
            if prev is not None and t - prev > step:
                b.add(rule.name, text, None, prev + step)
            b.add(rule.name, text, v, t)
            prev = t
        if prev is not None and prev + step <= end:
            b.add(rule.name, text, None, prev + step)
    if batches:
        mem.append_many(list(batches.values()))
