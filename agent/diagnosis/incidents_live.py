"""Incidents live: the sidecar's evaluation hook, which evaluates the rules every few seconds and opens,
updates and resolves rows of the `incidents` table, recording the stretches it covered."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from vllm_sentinel.agent.alerts.rulemodel import RuleFile, RuleGroup, fingerprint
from vllm_sentinel.agent.alerts.state import PENDING, GroupEvaluator, label_key, store_sink
from vllm_sentinel.agent.diagnosis.incident_evidence import evidence_values
from vllm_sentinel.agent.diagnosis.incident_fixes import compute_fixes
from vllm_sentinel.agent.diagnosis.incident_record import Incident
from vllm_sentinel.agent.diagnosis.incident_rules import ConfigFor, alerting_rules, groups_of, no_config
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store import coverage_table
from vllm_sentinel.agent.store.incidents_table import firing_incident_rows, upsert_incidents
from vllm_sentinel.agent.store.write_log import EVERYTHING

# live evaluations at most this far apart are one covered stretch; a sample written this much later than its
# time is late (the evaluations around its time did not see it) and the coverage is clipped back to it
COVERAGE_GAP_MS = 15_000


class Evaluator:
    """The sidecar's evaluation hook: `evaluator(store, now_ms)` evaluates the rules once and keeps
    the incidents table current. Returns {'active': {(incident, severity): n}, 'opened': [ids],
    'resolved': [ids], 'errors': ['rule: message']}."""

    def __init__(self, rules: list[RuleFile] | list[RuleGroup], engine_factory: Callable[[Any], Any] | None = None,
                 config_for: ConfigFor = no_config, external_labels: dict[str, str] | None = None,
                 coverage_gap_ms: int = COVERAGE_GAP_MS):
        self.groups = groups_of(rules)
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
        by_name = {r.name: r for r in alerting_rules(self.groups)}
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
        for rule in alerting_rules(self.groups):
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


def _live_engine(store: Any) -> Any:
    # evaluated every few seconds at advancing times: windows kept and topped up, not read whole each time
    return Engine(store, lookback_ms=300_000, incremental=True)
