"""Incidents over a past window: the alerting rules evaluated as range queries, then Prometheus' alert state
machine replayed over the steps, so an incident that came and went inside the window is found, `for` and
`keep_firing_for` included. Over the store, or over any engine (local or remote)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_sentinel.agent.alerts.backfill import needs_replay, replay_store
from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleFile, RuleGroup
from vllm_sentinel.agent.alerts.state import FIRING, AlertingRuleState, label_key
from vllm_sentinel.agent.diagnosis.incident_evidence import evidence_values
from vllm_sentinel.agent.diagnosis.incident_fixes import compute_fixes
from vllm_sentinel.agent.diagnosis.incident_record import Incident
from vllm_sentinel.agent.diagnosis.incident_rules import ConfigFor, alerting_rules, groups_of, no_config
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.remote import instant_all, range_all
from vllm_sentinel.collectors.prometheus import PrometheusError

DEFAULT_STEP_MS = 5_000


def evaluate_window(store: Any, start_ms: int, end_ms: int, instance: str | None,
                    rules: list[RuleFile] | list[RuleGroup], step_ms: int = DEFAULT_STEP_MS,
                    engine_factory: Callable[[Any], Any] | None = None,
                    config_for: ConfigFor = no_config) -> list[dict]:
    """Incidents of the alerting rules inside (start_ms, end_ms], found by range evaluation over the store.

    An alert that reads a recording rule's series the store lacks (history the sidecar never
    evaluated) runs on a replay copy where the recording rules were evaluated first
    (agent/alerts/backfill.py). The evaluation itself is `evaluate_rules`.
    """
    factory = engine_factory or _default_engine
    groups = groups_of(rules)
    alerts = alerting_rules(groups)
    if not alerts:
        return []
    overlay = None
    if needs_replay(store, groups):
        first = min(((start_ms - r.for_ms) // step_ms) * step_ms for r in alerts)
        overlay = replay_store(store, groups, first, end_ms, step_ms, factory)
    try:
        engine = factory(overlay if overlay is not None else store)
        return evaluate_rules(engine, start_ms, end_ms, instance, groups, step_ms, config_for)
    finally:
        if overlay is not None:
            overlay.close()


def evaluate_rules(engine: Any, start_ms: int, end_ms: int, instance: str | None,
                   rules: list[RuleFile] | list[RuleGroup], step_ms: int = DEFAULT_STEP_MS,
                   config_for: ConfigFor = no_config) -> list[dict]:
    """Incidents of the alerting rules inside (start_ms, end_ms], over any PromQL engine (local or remote).

    Each alert expression is evaluated once as a range query from `start_ms - for` (so an alert
    already pending at the window start can fire inside it) to `end_ms`, all of them at once where
    the engine can; the alert state machine then steps through each result exactly as live
    evaluation would. Evidence is read at each incident's peak, fixes computed from `config_for`.
    """
    alerts = alerting_rules(groups_of(rules))
    queries = [(r.expr, _first_step(r, start_ms, step_ms), end_ms, step_ms) for r in alerts]
    found: list[Incident] = []
    for rule, series in zip(alerts, range_all(engine, queries)):
        found.extend(_replay(rule, series, start_ms, end_ms, step_ms))
    found = [i for i in found if instance is None or i.labels.get("instance") == instance]
    asked = [(ev.expr, i.peak_ms if i.peak_ms is not None else i.start_ms) for i in found for ev in i.rule.evidence]
    answered = _answered_in_order(_answers(engine, asked))
    out = []
    for inc in found:
        inc.evidence = evidence_values(inc.rule, answered, 0, inc.labels)
        values = {e["signal"]: e["value"] for e in inc.evidence}
        inc.fixes = compute_fixes(inc.rule, config_for(inc.labels.get("instance")), values, inc.labels)
        out.append(inc.as_dict())
    out.sort(key=lambda d: (d["start"], d["rule"], d["id"]))
    return out


def _answers(engine: Any, asked: list[tuple[str, int]]) -> list[Any]:
    """The instant queries' results in order; one that fails stands as its exception (evidence shows it missing)."""
    try:
        return instant_all(engine, asked)
    except PrometheusError:
        raise  # the remote source itself failed (unreachable, 5xx): the command fails, no silent gaps
    except Exception:  # one bad evidence query must not cost the others: ask one by one
        out: list[Any] = []
        for expr, t in asked:
            try:
                out.append(engine.instant(expr, t))
            except PrometheusError:
                raise
            except Exception as e:
                out.append(e)
        return out


def _answered_in_order(answers: list[Any]) -> Callable[[str, int], Any]:
    """A query function that hands out answers already fetched, in the order they were asked."""
    pending = iter(answers)

    def query(_expr: str, _t_ms: int) -> Any:
        answer = next(pending)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return query


def _first_step(rule: Rule, start_ms: int, step_ms: int) -> int:
    """The first evaluation of a rule's replay: `for` before the window, on the step grid (so repeated
    diagnoses of overlapping windows agree)."""
    return ((start_ms - rule.for_ms) // step_ms) * step_ms


def _replay(rule: Rule, series: list[Any], start_ms: int, end_ms: int, step_ms: int) -> list[Incident]:
    """Step Prometheus' alert state machine over one range evaluation of the rule's expression."""
    first = _first_step(rule, start_ms, step_ms)
    by_t: dict[int, list[tuple[dict[str, str], float]]] = {}
    for s in series:
        for t, v in s.points:
            by_t.setdefault(t, []).append((dict(s.labels), float(v)))
    state = AlertingRuleState(rule)
    open_: dict[tuple, Incident] = {}
    done: list[Incident] = []
    # an incident's annotations are its alert's at its last firing step: expanded once, from that step's
    # sample (templating every step of every alert was a fifth of a fresh diagnose)
    last_sample: dict[int, tuple[dict[str, str], float]] = {}
    t = first
    while t <= end_ms:
        vector = by_t.get(t, [])
        if vector or state.active:
            state.eval(vector, t, annotate=False)
            firing_now = set()
            for a in state.active_alerts():
                if a.state != FIRING:
                    continue
                key = label_key(a.labels)
                firing_now.add(key)
                inc = open_.get(key)
                if inc is None:
                    inc = open_[key] = Incident(rule, dict(a.labels), a.fired_at_ms or t)
                last_sample[id(inc)] = (a.expr_labels, a.value)
                inc.observe(a.value, t)
            for key in [k for k in open_ if k not in firing_now]:
                inc = open_.pop(key)
                inc.end_ms = t
                done.append(inc)
        t += step_ms
    done.extend(open_.values())
    # keep episodes that overlap the window: fired by its end, not resolved before its start
    kept = [i for i in done if i.start_ms <= end_ms and (i.end_ms is None or i.end_ms > start_ms)]
    for inc in kept:
        inc.annotations = state.annotate(*last_sample[id(inc)])
    return kept


def window_evaluator(rules: list[RuleFile] | list[RuleGroup], step_ms: int = DEFAULT_STEP_MS,
                     config_for: ConfigFor = no_config) -> Callable[[Any, int, int, str | None], list[dict]]:
    """`diagnose`'s WindowEvaluator for these rules: (store, start_ms, end_ms, instance) -> incidents."""
    def evaluate(store: Any, start_ms: int, end_ms: int, instance: str | None) -> list[dict]:
        return evaluate_window(store, start_ms, end_ms, instance, rules, step_ms, config_for=config_for)
    return evaluate


def _default_engine(store: Any) -> Any:
    return Engine(store, lookback_ms=300_000)
