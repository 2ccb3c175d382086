"""Incidents: firing alerts of the loaded rules, with evidence and fixes, live and over a window.

* `Evaluator` is the sidecar's evaluation hook: called every few seconds with the store and a
  time, it evaluates the rules, and opens, updates and resolves rows of the `incidents` table.
* `evaluate_window` evaluates the alerting rules over a past window as a range query, then
  replays Prometheus' alert state machine over the steps, so an incident that came and went
  inside the window is found, `for` and `keep_firing_for` included. It returns incident dicts in
  the `diagnose --format json` contract.

An incident starts when its alert fires (Alertmanager's startsAt) and ends when it resolves.
Evidence is read at the incident's peak; fixes are computed from a configuration snapshot by
the functions of agent/diagnosis/fixes.py, registered with `register_fix` (unknown names say so).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_sentinel.agent.alerts.backfill import needs_replay, replay_store
from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleFile, RuleGroup, fingerprint
from vllm_sentinel.agent.alerts.state import (FIRING, PENDING, AlertingRuleState, GroupEvaluator,
                                              label_key, store_sink, to_vector)
# register_fix is the hook for a site's own fix computations; the 'not registered' message names it here
from vllm_sentinel.agent.diagnosis.fix_registry import as_live_config, register_fix  # noqa: F401
from vllm_sentinel.agent.diagnosis.fixes import FIXES
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.remote import instant_all, range_all
from vllm_sentinel.agent.store import coverage_table
from vllm_sentinel.agent.store.write_log import EVERYTHING
from vllm_sentinel.agent.store.incidents_table import firing_incident_rows, incidents_overlapping, upsert_incidents
from vllm_sentinel.collectors.prometheus import PrometheusError
from vllm_sentinel.collectors.timefmt import iso_precise

log = logging.getLogger(__name__)

DEFAULT_STEP_MS = 5_000
# live evaluations at most this far apart are one covered stretch; a sample written this much later than its
# time is late (the evaluations around its time did not see it) and the coverage is clipped back to it
COVERAGE_GAP_MS = 15_000
SAVE_EVERY_MS = 60_000  # an open incident's row is rewritten at least this often (its last value)
# labels an incident shows separately from its `labels`
_OWN_LABELS = ("alertname", "incident", "severity", "instance")

# -- fixes -----------------------------------------------------------------------------------------
def compute_fixes(rule: Rule, config: Mapping[str, Any], evidence: Mapping[str, float | None],
                  labels: Mapping[str, str]) -> list[dict]:
    """The rule's fix items, filled from `config` and the evidence values."""
    out = []
    for f in rule.fix:
        name = f.param.lstrip("-").replace("-", "_")
        current = config.get(name)
        item = {"param": f.param, "current": None if current is None else str(current),
                "suggested": f.suggest, "why": f.why}
        if f.compute:
            fn = FIXES.get(f.compute)
            if fn is None:
                item["why"] = f"fix function {f.compute!r} is not registered (see incidents.register_fix)"
            else:
                try:
                    computed = fn(as_live_config(config, labels.get("instance", "")), evidence)
                except Exception as e:  # a broken fix function must not stop incident tracking
                    log.warning("fix function %s failed: %s", f.compute, e)
                    item["why"] = f"fix function {f.compute!r} failed: {e}"
                else:
                    if computed is None:
                        continue
                    item.update(current=computed.current, suggested=computed.suggested, why=computed.why)
        source = _current_source(config, name, item["current"])
        if source:
            item["current_source"] = source  # where the current value came from: flag, engine, or inferred
        out.append(item)
    return out


def _current_source(config: Mapping[str, Any], name: str, current: str | None) -> str | None:
    """The configuration's source of `name` when the fix's current value is that configuration value."""
    if current is None or not isinstance(config, LiveConfig) or not config.known(name):
        return None
    return config.source(name) if str(config.get(name)) == current else None


# -- evidence ----------------------------------------------------------------------------------
def _matches(sample_labels: Mapping[str, str], alert_labels: Mapping[str, str]) -> int:
    """How many labels a sample shares with the alert, or -1 when one of them disagrees."""
    shared = 0
    for k, v in sample_labels.items():
        if k == "__name__":
            continue
        if k in alert_labels:
            if alert_labels[k] != v:
                return -1
            shared += 1
    return shared


def pick_for_alert(vector: list[tuple[dict[str, str], float]], labels: Mapping[str, str]) -> float | None:
    """The sample of an evidence result that belongs to an alert: the one agreeing with the alert's
    labels and sharing most of them ({instance: a} picks the series of instance a)."""
    best, best_score = None, -1
    for sl, v in vector:
        score = _matches(sl, labels)
        if score > best_score:
            best, best_score = v, score
    return best


def evidence_values(rule: Rule, query: Callable[[str, int], Any], t_ms: int,
                    labels: Mapping[str, str]) -> list[dict]:
    """Each evidence signal of `rule` evaluated at `t_ms` for the alert with `labels`."""
    out = []
    for ev in rule.evidence:
        try:
            value = pick_for_alert(to_vector(query(ev.expr, t_ms)), labels)
        except Exception as e:  # an evidence query that fails is shown as missing, with why
            log.warning("evidence %s of %s failed: %s", ev.signal, rule.name, e)
            value = None
        # the expression travels with the value, so a report can chart it after the rule file changed
        out.append({"signal": ev.signal, "value": _json_float(value), "threshold": ev.threshold, "unit": ev.unit,
                    "expr": ev.expr})
    return out


def _json_float(v: float | None) -> float | None:
    if v is None or v != v or v in (float("inf"), float("-inf")):
        return None  # JSON has no NaN/Inf
    return v


# -- incident records ----------------------------------------------------------------------------
def duration_s(start_ms: int, end_ms: int | None) -> float | None:
    """Seconds from start to end of a resolved incident, None while it fires: (1000, 19500) -> 18.5."""
    return None if end_ms is None else round((end_ms - start_ms) / 1000, 1)


def incident_id(rule: str, labels: Mapping[str, str], start_ms: int) -> str:
    """Stable id from rule, labels and start: the same episode always gets the same id."""
    text = rule + "\x00" + json.dumps(sorted(labels.items())) + "\x00" + str(start_ms)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Incident:
    """One firing episode of one alert."""

    rule: Rule
    labels: dict[str, str]
    start_ms: int
    end_ms: int | None = None
    peak: float | None = None
    peak_ms: int | None = None
    last_value: float | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    evidence: list[dict] = field(default_factory=list)
    fixes: list[dict] = field(default_factory=list)
    saved: tuple = field(default=(), repr=False, compare=False)  # what the table last got (see `unsaved`)

    def unsaved(self, now_ms: int) -> bool:
        """True when the row holds something the table lacks: a new state, peak, annotations, evidence or
        fixes, or a last value older than SAVE_EVERY_MS; marks it saved."""
        what = (self.end_ms, self.peak, self.peak_ms, self.annotations, self.evidence, self.fixes)
        if self.saved and self.saved[0] == what and now_ms - self.saved[1] < SAVE_EVERY_MS:
            return False
        self.saved = (what, now_ms)
        return True

    @property
    def id(self) -> str:
        """The stable id."""
        return incident_id(self.rule.name, self.labels, self.start_ms)

    @property
    def state(self) -> str:
        """'firing' or 'resolved'."""
        return "firing" if self.end_ms is None else "resolved"

    def observe(self, value: float, t_ms: int) -> bool:
        """Record a value while firing; True when it is a new peak (evidence is then re-read)."""
        self.last_value = value
        if self.peak is None or value > self.peak or (self.peak != self.peak and value == value):
            self.peak, self.peak_ms = value, t_ms
            return True
        return False

    def as_dict(self) -> dict:
        """The incident in the diagnose JSON contract."""
        return {
            "id": self.id,
            "incident": self.labels.get("incident") or self.rule.incident or self.rule.name,
            "rule": self.rule.name,
            "severity": self.labels.get("severity") or self.rule.severity,
            "instance": self.labels.get("instance"),
            "labels": {k: v for k, v in sorted(self.labels.items()) if k not in _OWN_LABELS},
            "start": iso_precise(self.start_ms),
            "end": iso_precise(self.end_ms),
            "duration_s": duration_s(self.start_ms, self.end_ms),
            "state": self.state,
            "summary": self.annotations.get("summary", ""),
            "peak": _json_float(self.peak),
            "evidence": self.evidence,
            "fixes": self.fixes,
        }


ConfigFor = Callable[[str | None], Mapping[str, Any]]


def _no_config(_instance: str | None) -> Mapping[str, Any]:
    return {}


def _alerting_rules(groups: list[RuleGroup]) -> list[Rule]:
    return [r for g in groups for r in g.rules if r.is_alert]


def _groups_of(rules: list[RuleFile] | list[RuleGroup]) -> list[RuleGroup]:
    out: list[RuleGroup] = []
    for x in rules:
        out.extend(x.groups if isinstance(x, RuleFile) else [x])
    return out


# -- live evaluation -------------------------------------------------------------------------------
class Evaluator:
    """The sidecar's evaluation hook: `evaluator(store, now_ms)` evaluates the rules once and keeps
    the incidents table current. Returns {'active': {(incident, severity): n}, 'opened': [ids],
    'resolved': [ids], 'errors': ['rule: message']}."""

    def __init__(self, rules: list[RuleFile] | list[RuleGroup], engine_factory: Callable[[Any], Any] | None = None,
                 config_for: ConfigFor = _no_config, external_labels: dict[str, str] | None = None,
                 coverage_gap_ms: int = COVERAGE_GAP_MS):
        self.groups = _groups_of(rules)
        self.pack = fingerprint(self.groups)
        self.coverage_gap_ms = coverage_gap_ms
        self._covered_to: int | None = None  # time of the last evaluation recorded in rule_coverage
        self._mark = 0  # the store's write-log position at that evaluation
        self.config_for = config_for
        self.external_labels = external_labels
        self._engine_factory = engine_factory or _live_engine
        self._store: Any = None
        self._engine: Any = None
        self._groups_eval: GroupEvaluator | None = None
        self.open: dict[tuple[str, tuple], Incident] = {}

    def _bind(self, store: Any) -> None:
        if self._store is store:
            return
        self._store = store
        self._engine = self._engine_factory(store)
        self._groups_eval = GroupEvaluator(self.groups, self._engine.instant, store_sink(store),
                                           external_labels=self.external_labels)
        self._load_open(store)

    def _load_open(self, store: Any) -> None:
        # episodes still firing when the sidecar stopped continue if the alert fires again
        by_name = {r.name: r for r in _alerting_rules(self.groups)}
        for rule_name, labels, start, peak, peak_ms, last, ann, ev, fx in firing_incident_rows(store):
            rule = by_name.get(rule_name)
            if rule is None:
                continue
            labels = dict(labels)
            inc = Incident(rule, labels, start, None, peak, peak_ms, last, json.loads(ann or "{}"),
                           json.loads(ev or "[]"), json.loads(fx or "[]"))
            self.open[(rule.name, label_key(labels))] = inc

    def __call__(self, store: Any, now_ms: int) -> dict:
        """Evaluate all rules at `now_ms` and update the incidents table."""
        self._bind(store)
        assert self._groups_eval is not None
        results = self._groups_eval.eval(now_ms)
        errors = [f"{r.rule.name}: {r.error}" for r in results if r.error]
        self._cover(store, now_ms, clean=not errors)
        opened, changed, resolved = [], [], []
        seen: set[tuple[str, tuple]] = set()
        for rule in _alerting_rules(self.groups):
            state = self._groups_eval.state(rule)
            for a in state.active_alerts():
                key = (rule.name, label_key(a.labels))
                inc = self.open.get(key)
                if a.state == PENDING:
                    if inc is not None:
                        seen.add(key)  # re-pending after a restart: the open episode is not over yet
                    continue
                seen.add(key)
                if inc is None:
                    inc = Incident(rule, dict(a.labels), a.fired_at_ms or now_ms)
                    self.open[key] = inc
                    opened.append(inc)
                inc.annotations = dict(a.annotations)
                if inc.observe(a.value, now_ms) or not inc.evidence:
                    self._fill(inc, now_ms)
                changed.append(inc)
        for key, inc in list(self.open.items()):
            if key not in seen:
                inc.end_ms = now_ms
                resolved.append(inc)
                del self.open[key]
        self._save(store, changed + resolved, now_ms)
        active: dict[tuple[str, str], int] = {}
        for inc in self.open.values():
            d = (inc.labels.get("incident") or inc.rule.name, inc.labels.get("severity") or "")
            active[d] = active.get(d, 0) + 1
        return {"active": active, "opened": [i.id for i in opened], "resolved": [i.id for i in resolved],
                "errors": errors}

    def _cover(self, store: Any, now_ms: int, clean: bool) -> None:
        """Record this evaluation in rule_coverage (diagnose then need not replay its stretch of time)."""
        writes = getattr(store, "writes", None)
        if writes is None:
            return
        late = writes.oldest_since(self._mark) if self._covered_to is not None else None
        if late is not None and late != EVERYTHING and late < self._covered_to - self.coverage_gap_ms:
            coverage_table.clip(store, late)  # evaluations after `late` ran without those samples
            self._covered_to = None
        self._mark = writes.mark()
        if not clean:  # a rule failed: this evaluation covers nothing, and the next starts a new stretch
            self._covered_to = None
            return
        coverage_table.extend(store, self.pack, now_ms, self.coverage_gap_ms, new_run=self._covered_to is None)
        self._covered_to = now_ms

    def instant(self, expr: str, t_ms: int) -> Any:
        """An instant query over the store the last evaluation ran on (for signals beside the incidents)."""
        assert self._engine is not None, "evaluate once before querying"
        return self._engine.instant(expr, t_ms)

    def _fill(self, inc: Incident, t_ms: int) -> None:
        inc.evidence = evidence_values(inc.rule, self._engine.instant, t_ms, inc.labels)
        values = {e["signal"]: e["value"] for e in inc.evidence}
        inc.fixes = compute_fixes(inc.rule, self.config_for(inc.labels.get("instance")), values, inc.labels)

    def _save(self, store: Any, incidents: list[Incident], now_ms: int) -> None:
        # an open incident's row changes every evaluation only by its last value: written when something
        # else changed, and once a minute (an upsert costs the daemon milliseconds every 5 s otherwise)
        incidents = [i for i in incidents if i.unsaved(now_ms)]
        if not incidents:
            return
        rows = [(i.id, i.labels.get("incident") or i.rule.incident or i.rule.name, i.rule.name,
                 i.labels.get("severity") or i.rule.severity, i.labels.get("instance"), i.labels,
                 json.dumps(sorted(i.labels.items())), i.start_ms, i.end_ms, i.state, i.peak, i.peak_ms,
                 i.last_value, i.annotations.get("summary", ""), json.dumps(i.annotations),
                 json.dumps(i.evidence), json.dumps(i.fixes), now_ms) for i in incidents]
        upsert_incidents(store, rows)


def stored_incidents(store: Any, start_ms: int, end_ms: int, instance: str | None = None) -> list[dict]:
    """Incidents from the table that overlap (start_ms, end_ms], in the diagnose JSON contract."""
    rows = incidents_overlapping(store, start_ms, end_ms, instance)
    return [{"id": r[0], "incident": r[1], "rule": r[2], "severity": r[3], "instance": r[4],
             "labels": {k: v for k, v in sorted(dict(r[5]).items()) if k not in _OWN_LABELS},
             "start": iso_precise(r[6]), "end": iso_precise(r[7]), "duration_s": duration_s(r[6], r[7]),
             "state": r[8], "summary": r[9] or "",
             "peak": _json_float(r[10]), "evidence": json.loads(r[11] or "[]"), "fixes": json.loads(r[12] or "[]")}
            for r in rows]


# -- evaluation over a window ------------------------------------------------------------------
def evaluate_window(store: Any, start_ms: int, end_ms: int, instance: str | None,
                    rules: list[RuleFile] | list[RuleGroup], step_ms: int = DEFAULT_STEP_MS,
                    engine_factory: Callable[[Any], Any] | None = None,
                    config_for: ConfigFor = _no_config) -> list[dict]:
    """Incidents of the alerting rules inside (start_ms, end_ms], found by range evaluation over the store.

    An alert that reads a recording rule's series the store lacks (history the sidecar never
    evaluated) runs on a replay copy where the recording rules were evaluated first
    (agent/alerts/backfill.py). The evaluation itself is `evaluate_rules`.
    """
    factory = engine_factory or _default_engine
    groups = _groups_of(rules)
    alerts = _alerting_rules(groups)
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
                   config_for: ConfigFor = _no_config) -> list[dict]:
    """Incidents of the alerting rules inside (start_ms, end_ms], over any PromQL engine (local or remote).

    Each alert expression is evaluated once as a range query from `start_ms - for` (so an alert
    already pending at the window start can fire inside it) to `end_ms`, all of them at once where
    the engine can; the alert state machine then steps through each result exactly as live
    evaluation would. Evidence is read at each incident's peak, fixes computed from `config_for`.
    """
    alerts = _alerting_rules(_groups_of(rules))
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
                     config_for: ConfigFor = _no_config) -> Callable[[Any, int, int, str | None], list[dict]]:
    """`diagnose`'s WindowEvaluator for these rules: (store, start_ms, end_ms, instance) -> incidents."""
    def evaluate(store: Any, start_ms: int, end_ms: int, instance: str | None) -> list[dict]:
        return evaluate_window(store, start_ms, end_ms, instance, rules, step_ms, config_for=config_for)
    return evaluate


def _default_engine(store: Any) -> Any:
    return Engine(store, lookback_ms=300_000)


def _live_engine(store: Any) -> Any:
    # evaluated every few seconds at advancing times: windows kept and topped up, not read whole each time
    return Engine(store, lookback_ms=300_000, incremental=True)
