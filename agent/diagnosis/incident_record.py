"""An incident: one firing episode of one alert, its stable id, and its form in the diagnose JSON contract
(from the record, and from the rows of the incidents table)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_sentinel.agent.alerts.rulemodel import Rule
from vllm_sentinel.agent.diagnosis.incident_evidence import json_float
from vllm_sentinel.agent.store.incidents_table import incidents_overlapping
from vllm_sentinel.collectors.timefmt import iso_precise

SAVE_EVERY_MS = 60_000  # an open incident's row is rewritten at least this often (its last value)
# labels an incident shows separately from its `labels`
_OWN_LABELS = ("alertname", "incident", "severity", "instance")


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
            "peak": json_float(self.peak),
            "evidence": self.evidence,
            "fixes": self.fixes,
        }


def stored_incidents(store: Any, start_ms: int, end_ms: int, instance: str | None = None) -> list[dict]:
    """Incidents from the table that overlap (start_ms, end_ms], in the diagnose JSON contract."""
    rows = incidents_overlapping(store, start_ms, end_ms, instance)
    return [{"id": r[0], "incident": r[1], "rule": r[2], "severity": r[3], "instance": r[4],
             "labels": {k: v for k, v in sorted(dict(r[5]).items()) if k not in _OWN_LABELS},
             "start": iso_precise(r[6]), "end": iso_precise(r[7]), "duration_s": duration_s(r[6], r[7]),
             "state": r[8], "summary": r[9] or "",
             "peak": json_float(r[10]), "evidence": json.loads(r[11] or "[]"), "fixes": json.loads(r[12] or "[]")}
            for r in rows]
