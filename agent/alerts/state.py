"""Alert state and rule-group evaluation, exactly as Prometheus' rules package does it.

An alert goes inactive -> pending when its expression returns its label set, pending -> firing
once it has been active for `for`, and back to inactive (resolved) when the expression stops
returning it, `keep_firing_for` after that for a firing alert. Labels and annotations are
templated per evaluation with `$labels`, `$value` and Prometheus' functions. Recording rules
write their result back so later rules (and later groups) see it at the same timestamp; series
that vanish get a staleness marker, as Prometheus writes them. Ported from Prometheus 2.42
rules/alerting.go, rules/recording.go and rules/manager.go (Group.Eval).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleGroup
from vllm_sentinel.agent.alerts.template_functions import QuerySample
from vllm_sentinel.agent.alerts.templating import expand_alert_template
from vllm_sentinel.collectors.base import Batch

INACTIVE, PENDING, FIRING = "inactive", "pending", "firing"
# a resolved alert stays in the active map this long (Prometheus keeps it to resend "resolved")
RESOLVED_RETENTION_MS = 15 * 60_000

LabelKey = tuple[tuple[str, str], ...]
# (labels including __name__, value); value None writes a staleness marker
OutSample = tuple[dict[str, str], float | None]
SampleSink = Callable[[int, list[OutSample]], None]
QueryFn = Callable[[str, int], Any]  # (expr, t_ms) -> what Engine.instant returns


class RuleEvalError(Exception):
    """A rule failed to evaluate at a timestamp (bad result type, duplicate label sets, limit)."""


def label_key(labels: dict[str, str]) -> LabelKey:
    """A hashable, order-free key for a label set."""
    return tuple(sorted(labels.items()))


def to_vector(result: Any) -> list[tuple[dict[str, str], float]]:
    """An instant-query result as a vector, as Prometheus' EngineQueryFunc: a scalar becomes one
    sample without labels; a range vector is an error."""
    if isinstance(result, (int, float)):
        return [({}, float(result))]
    out = []
    for s in result:
        if hasattr(s, "points"):
            raise RuleEvalError("rule result is not a vector or scalar")
        out.append((dict(s.labels), float(s.value)))
    return out


@dataclass
class Alert:
    """One alert of an alerting rule: a label set and where it is in its life."""

    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    value: float
    active_at_ms: int
    fired_at_ms: int | None = None
    resolved_at_ms: int | None = None
    keep_firing_since_ms: int | None = None
    # labels of the expression's sample (with __name__), for matching evidence series
    expr_labels: dict[str, str] = field(default_factory=dict)


class AlertingRuleState:
    """The active alerts of one alerting rule across evaluations."""

    def __init__(self, rule: Rule, external_labels: dict[str, str] | None = None, external_url: str = ""):
        self.rule = rule
        self.external_labels = dict(external_labels or {})
        self.external_url = external_url
        self.active: dict[LabelKey, Alert] = {}

    def expand(self, text: str, metric: dict[str, str], value: float,
               query: Callable[[str], list[QuerySample]] | None = None) -> str:
        """One label or annotation of this rule expanded for a sample; a failure is put in the text, as Prometheus does."""
        if "{{" not in text:  # no action: the template is its own text (the definitions before it print nothing)
            return text
        try:
            return expand_alert_template(text, metric, value, self.external_labels, self.external_url, query,
                                         self.rule.name)
        except Exception as e:  # Prometheus puts the error in the text, never drops the alert
            return f"<error expanding template: {e}>"

    def annotate(self, metric: dict[str, str], value: float,
                 query: Callable[[str], list[QuerySample]] | None = None) -> dict[str, str]:
        """The rule's annotations for one sample of its expression (`metric` with __name__, its value)."""
        return {k: self.expand(v, metric, value, query) for k, v in self.rule.annotations.items()}

    def eval(self, vector: list[tuple[dict[str, str], float]], ts_ms: int, limit: int = 0,
             query: Callable[[str], list[QuerySample]] | None = None, annotate: bool = True) -> list[OutSample]:
        """Advance the alerts with one evaluation's result; returns the ALERTS / ALERTS_FOR_STATE samples.

        With `annotate` off the alerts' annotations stay empty: a replay that needs only the last ones
        expands them once from the alert's `expr_labels` and `value` (`annotate()`), the same inputs."""
        rule = self.rule
        fresh: dict[LabelKey, Alert] = {}
        for metric, value in vector:
            labels = {k: v for k, v in metric.items() if k != "__name__"}
            for k, v in rule.labels.items():
                labels[k] = self.expand(v, metric, value, query)
            labels["alertname"] = rule.name
            # an empty label value means "no label", as in Prometheus' label builder
            labels = {k: v for k, v in labels.items() if v != ""}
            annotations = self.annotate(metric, value, query) if annotate else {}
            key = label_key(labels)
            if key in fresh:
                raise RuleEvalError("vector contains metrics with the same labelset after applying alert labels")
            fresh[key] = Alert(labels, annotations, PENDING, value, ts_ms, expr_labels=dict(metric))

        for key, a in fresh.items():
            old = self.active.get(key)
            if old is not None and old.state != INACTIVE:
                old.value, old.annotations, old.expr_labels = a.value, a.annotations, a.expr_labels
                continue
            self.active[key] = a

        out: list[OutSample] = []
        n_active = 0
        for key, a in list(self.active.items()):
            if key not in fresh:
                keep_firing = False
                if a.state == FIRING and rule.keep_firing_for_ms > 0:
                    if a.keep_firing_since_ms is None:
                        a.keep_firing_since_ms = ts_ms
                    keep_firing = ts_ms - a.keep_firing_since_ms < rule.keep_firing_for_ms
                if a.state == PENDING or (a.resolved_at_ms is not None
                                          and ts_ms - a.resolved_at_ms > RESOLVED_RETENTION_MS):
                    del self.active[key]
                if a.state != INACTIVE and not keep_firing:
                    a.state = INACTIVE
                    a.resolved_at_ms = ts_ms
                if not keep_firing:
                    continue
            else:
                a.keep_firing_since_ms = None
            n_active += 1
            if a.state == PENDING and ts_ms - a.active_at_ms >= rule.for_ms:
                a.state = FIRING
                a.fired_at_ms = ts_ms
            out.append(({**rule.labels, **a.labels, "__name__": "ALERTS", "alertstate": a.state}, 1.0))
            out.append(({**rule.labels, **a.labels, "__name__": "ALERTS_FOR_STATE"}, a.active_at_ms // 1000))

        if limit > 0 and n_active > limit:
            self.active = {}
            raise RuleEvalError(f"exceeded limit of {limit} with {n_active} alerts")
        return [(lbl, float(v)) for lbl, v in out]

    def active_alerts(self) -> list[Alert]:
        """Pending and firing alerts (resolved ones are kept internally, as Prometheus does)."""
        return [a for a in self.active.values() if a.resolved_at_ms is None]

    def firing(self) -> list[Alert]:
        """Alerts in the firing state."""
        return [a for a in self.active.values() if a.state == FIRING]


def eval_recording(rule: Rule, vector: list[tuple[dict[str, str], float]], limit: int = 0) -> list[OutSample]:
    """A recording rule's output: the result renamed to the rule and its labels set."""
    out: list[OutSample] = []
    seen: set[LabelKey] = set()
    for metric, value in vector:
        labels = {**metric, "__name__": rule.name, **rule.labels}
        labels = {k: v for k, v in labels.items() if v != ""}
        key = label_key(labels)
        if key in seen:
            raise RuleEvalError("vector contains metrics with the same labelset after applying rule labels")
        seen.add(key)
        out.append((labels, value))
    if limit > 0 and len(out) > limit:
        raise RuleEvalError(f"exceeded limit of {limit} with {len(out)} series")
    return out


@dataclass
class RuleResult:
    """What one rule did at one evaluation."""

    rule: Rule
    error: str | None = None
    vector: list[tuple[dict[str, str], float]] = field(default_factory=list)


class GroupEvaluator:
    """Evaluates rule groups in order at a timestamp, keeping alert state between calls.

    `query(expr, t_ms)` runs an instant query (Engine.instant); `sink(t_ms, samples)` receives
    recording-rule output, ALERTS series and staleness markers (None values) and must make them
    visible to the next query, as Prometheus' appender commit does.
    """

    def __init__(self, groups: Iterable[RuleGroup], query: QueryFn, sink: SampleSink | None = None,
                 external_labels: dict[str, str] | None = None, external_url: str = "",
                 write_alerts: bool = True):
        self.groups = list(groups)
        self.query = query
        self.sink = sink
        self.write_alerts = write_alerts
        self.states: dict[int, AlertingRuleState] = {}
        self._previous: dict[int, dict[LabelKey, dict[str, str]]] = {}
        # ALERTS series of the alerting rules go to the sink in one write once every group is evaluated (one
        # transaction each cost the daemon milliseconds every evaluation), or before a rule that reads them;
        # Prometheus evaluates groups apart, so no group may count on another's output of the same moment
        self._pending: list[OutSample] = []
        self._reads_alerts: set[int] = set()
        for g in self.groups:
            for r in g.rules:
                if r.is_alert:
                    self.states[id(r)] = AlertingRuleState(r, external_labels, external_url)
                texts = [r.expr, *r.labels.values(), *r.annotations.values()]
                if any("ALERTS" in t for t in texts):
                    self._reads_alerts.add(id(r))

    def state(self, rule: Rule) -> AlertingRuleState:
        """The alert state of an alerting rule."""
        return self.states[id(rule)]

    def eval(self, ts_ms: int) -> list[RuleResult]:
        """Evaluate every rule of every group once at `ts_ms`, in order."""
        results: list[RuleResult] = []
        for g in self.groups:
            for r in g.rules:
                if self._pending and id(r) in self._reads_alerts:
                    self._flush(ts_ms)
                results.append(self._eval_rule(r, g.limit, ts_ms))
        self._flush(ts_ms)
        return results

    def _flush(self, ts_ms: int) -> None:
        if self._pending and self.sink is not None:
            pending, self._pending = self._pending, []
            self.sink(ts_ms, pending)

    def _eval_rule(self, rule: Rule, limit: int, ts_ms: int) -> RuleResult:
        res = RuleResult(rule)
        try:
            res.vector = to_vector(self.query(rule.expr, ts_ms))
            if rule.is_alert:
                def tmpl_query(q: str) -> list[QuerySample]:
                    return [QuerySample(lbl, v) for lbl, v in to_vector(self.query(q, ts_ms))]
                out = self.states[id(rule)].eval(res.vector, ts_ms, limit, tmpl_query)
                if not self.write_alerts:
                    out = []
            else:
                out = eval_recording(rule, res.vector, limit)
        except Exception as e:  # the engine's PromQLError/Unsupported, RuleEvalError: the rule is unhealthy
            res.error = str(e) or type(e).__name__
            return res
        self._write(rule, out, ts_ms)
        return res

    def _write(self, rule: Rule, out: list[OutSample], ts_ms: int) -> None:
        if self.sink is None:
            return
        returned = {label_key(lbl): lbl for lbl, _ in out}
        previous = self._previous.get(id(rule), {})
        stale = [(lbl, None) for key, lbl in previous.items() if key not in returned]
        self._previous[id(rule)] = returned
        if rule.is_alert:
            self._pending.extend(out + stale)
        elif out or stale:
            self.sink(ts_ms, out + stale)  # a recording rule's output: the next rule may read it


def samples_to_batches(ts_ms: int, samples: list[OutSample]) -> list[Batch]:
    """Rule output as store Batches, one per instance: ({'__name__': 'x', 'instance': 'a'}, 1.0) ->
    Batch(instance='a', metrics=['x'], ...). A NaN value stays NaN; None is a staleness marker."""
    batches: dict[str, Batch] = {}
    for labels, value in samples:
        instance = labels.get("instance", "")
        b = batches.get(instance)
        if b is None:
            b = batches[instance] = Batch(instance=instance, ts_ms=ts_ms)
        rest = {k: v for k, v in labels.items() if k not in ("__name__", "instance")}
        b.add(labels["__name__"], rest, value)
    return list(batches.values())


def store_sink(store: Any) -> SampleSink:
    """A sink that appends rule output to the store in one transaction per rule."""
    def sink(ts_ms: int, samples: list[OutSample]) -> None:
        store.append_many(samples_to_batches(ts_ms, samples))
    return sink

