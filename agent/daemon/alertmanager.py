"""Incidents leave the sidecar as Alertmanager alerts (POST /api/v2/alerts), the way Prometheus sends them.

A firing incident is sent when it opens and again every `resend_s`, with endsAt a few resend
periods ahead (Prometheus' ValidUntil), so Alertmanager resolves it by itself if the sidecar dies.
A resolved incident is sent with its end time, and resent for 15 minutes in case Alertmanager was
down the first time. Sending runs on its own thread with a bounded queue: a slow or dead
Alertmanager never delays scraping or evaluation, and what could not be sent is counted.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_sentinel.agent.daemon.alert_fixes import RankedFixes, fix_annotations
from vllm_sentinel.agent.diagnosis.incidents import Incident
from vllm_sentinel.collectors.timefmt import iso_precise

log = logging.getLogger("vllm_sentinel.alertmanager")

RESEND_S = 60.0  # Prometheus' --rules.alert.resend-delay default
RESOLVED_RESEND_MS = 15 * 60_000  # Prometheus keeps resending a resolved alert this long
QUEUE_MAX = 64  # batches waiting to be sent; beyond that the oldest are dropped and counted

# (url, JSON body, timeout) -> None; raises OSError/HTTPError on failure; injectable for tests
Post = Callable[[str, bytes, float], None]
Count = Callable[[str, str, int], None]  # (alertmanager URL, result: sent | failed | dropped, alerts)
Rank = Callable[[Any, Incident, int], RankedFixes]  # (a store reader, the incident, now ms) -> its ranked fixes
Gate = Callable[[str, bool], bool]  # (work, retry) -> may optional work run now (the CPU budget)
SATURATED = "the host was saturated; the next resend tries again"


class AlertmanagerError(ValueError):
    """A wrong --alertmanager URL, named with the fix."""


def alerts_url(base: str) -> str:
    """The v2 alerts endpoint of an Alertmanager given as http://host:9093 (a path prefix is kept)."""
    parts = urllib.parse.urlsplit(base.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AlertmanagerError(f"--alertmanager {base!r}: give the Alertmanager URL, e.g. http://127.0.0.1:9093")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/api/v2/alerts", "", ""))


def http_post(url: str, body: bytes, timeout_s: float) -> None:
    """POST JSON; raises on anything but 2xx (Alertmanager answers 200 with an empty body)."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - an operator-given URL
        resp.read(4096)


def to_alert(inc: Incident, now_ms: int, valid_ms: int, generator_url: str = "",
             fix_notes: dict[str, str] | None = None) -> dict:
    """One PostableAlert: the rule name as alertname, the incident's labels, annotations with its id and fix
    (`fix_notes`: the ranked fix's annotations; None: the first fix in the rule's order)."""
    labels = {"alertname": inc.rule.name, **{k: str(v) for k, v in inc.labels.items() if k != "__name__"}}
    annotations = {k: str(v) for k, v in inc.annotations.items()}
    annotations["incident_id"] = inc.id
    annotations["report"] = f"vllm-sentinel report {inc.id}"
    annotations.update(fix_annotations(inc.fixes, None) if fix_notes is None else fix_notes)
    end_ms = inc.end_ms if inc.end_ms is not None else now_ms + valid_ms
    alert = {"labels": labels, "annotations": annotations, "startsAt": iso_precise(inc.start_ms),
             "endsAt": iso_precise(end_ms)}
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert


@dataclass
class _Sent:
    incident: Incident
    last_sent_ms: int


@dataclass
class _Batch:
    """Alerts due at one evaluation; the sender's thread ranks the incidents new to it and rewrites their fix."""

    alerts: list[dict]
    now_ms: int
    to_rank: list[Incident] = field(default_factory=list)  # copies: the evaluator goes on changing its own
    reader: Any = None  # a store view opened on the evaluation's thread, for the ranking


class AlertmanagerNotifier:
    """After each evaluation, queue the alerts that are due; a thread ranks new incidents' fixes (with `rank`,
    where `gate` allows) and posts them to every Alertmanager."""

    def __init__(self, urls: Iterable[str], *, resend_s: float = RESEND_S, eval_interval_s: float = 5.0,
                 timeout_s: float = 10.0, post: Post = http_post, count: Count | None = None,
                 generator_url: str = "", rank: Rank | None = None, gate: Gate | None = None) -> None:
        self.urls = [alerts_url(u) for u in urls]
        self.resend_ms = int(resend_s * 1000)
        # as Prometheus: valid for 4 x max(evaluation interval, resend delay)
        self.valid_ms = 4 * max(int(eval_interval_s * 1000), self.resend_ms)
        self.timeout_s = timeout_s
        self.post = post
        self.count = count or (lambda url, result, n: None)
        self.generator_url = generator_url
        self.rank, self.gate = rank, gate
        self._ranked: dict[str, RankedFixes] = {}  # incident id -> its fixes as the model ranked them
        self._ranking: set[str] = set()  # queued for ranking, not ranked yet
        self._firing: dict[str, _Sent] = {}
        self._resolved: dict[str, _Sent] = {}
        self._queue: queue.Queue[_Batch | None] = queue.Queue(maxsize=QUEUE_MAX)
        self.status: dict[str, dict] = {u: {"sent": 0, "failed": 0, "dropped": 0, "last_error": None} for u in self.urls}
        self._thread = threading.Thread(target=self._run, daemon=True, name="alertmanager")
        self._thread.start()

    def after_evaluation(self, now_ms: int, firing: Iterable[Incident], resolved: Iterable[Incident],
                         reader: Callable[[], Any] | None = None) -> None:
        """Queue what is due at `now_ms`: new and resend-due firing incidents, new and retained resolved ones.
        `reader()` opens a store view for ranking the fixes of firing incidents not ranked yet."""
        due: list[Incident] = []
        firing_now = {inc.id: inc for inc in firing}
        for iid, inc in firing_now.items():
            sent = self._firing.get(iid)
            if sent is None or now_ms - sent.last_sent_ms >= self.resend_ms:
                due.append(inc)
                self._firing[iid] = _Sent(inc, now_ms)
        for inc in resolved:
            self._firing.pop(inc.id, None)
            due.append(inc)
            self._resolved[inc.id] = _Sent(inc, now_ms)
        for iid, sent in list(self._resolved.items()):
            end = sent.incident.end_ms or now_ms
            if now_ms - end > RESOLVED_RESEND_MS:
                del self._resolved[iid]
            elif now_ms - sent.last_sent_ms >= self.resend_ms:
                due.append(sent.incident)
                sent.last_sent_ms = now_ms
        for iid in [i for i in self._firing if i not in firing_now]:  # gone without a resolve (rule removed)
            del self._firing[iid]
        for iid in [i for i in list(self._ranked) if i not in self._firing and i not in self._resolved]:
            self._ranked.pop(iid, None)
        if due:
            self._enqueue(self._batch(due, now_ms, reader))

    def _batch(self, due: list[Incident], now_ms: int, reader: Callable[[], Any] | None) -> _Batch:
        alerts = [to_alert(inc, now_ms, self.valid_ms, self.generator_url, self._notes(inc)) for inc in due]
        if self.rank is None or reader is None:
            return _Batch(alerts, now_ms)
        new = [inc for inc in due if inc.end_ms is None and inc.fixes
               and inc.id not in self._ranked and inc.id not in self._ranking]
        if not new or (self.gate is not None and not self.gate("alert fix ranking", False)):
            return _Batch(alerts, now_ms)
        self._ranking.update(inc.id for inc in new)
        return _Batch(alerts, now_ms, [replace(inc, fixes=[dict(f) for f in inc.fixes]) for inc in new], reader())

    def _notes(self, inc: Incident) -> dict[str, str] | None:
        ranked = self._ranked.get(inc.id)
        if ranked is not None:
            return fix_annotations(*ranked)
        if self.rank is None:
            return None
        return fix_annotations(inc.fixes, None, "" if inc.end_ms is not None else SATURATED)

    def _enqueue(self, batch: _Batch) -> None:
        try:
            self._queue.put_nowait(batch)
        except queue.Full:  # Alertmanager is slower than the rules: drop the oldest batch, keep the newest
            try:
                dropped = self._queue.get_nowait()
                if dropped is not None:
                    self._ranking.difference_update(inc.id for inc in dropped.to_rank)
                    for url in self.urls:
                        self.status[url]["dropped"] += len(dropped.alerts)
                        self.count(url, "dropped", len(dropped.alerts))
            except queue.Empty:
                pass
            self._queue.put_nowait(batch)

    def _rank(self, batch: _Batch) -> None:
        """Rank the batch's new incidents, then lead their alerts with the ranked fix."""
        for inc in batch.to_rank:
            try:
                self._ranked[inc.id] = self.rank(batch.reader, inc, batch.now_ms)  # type: ignore[misc]
            except Exception as exc:  # the alert goes out in the rule's order rather than not at all
                log.warning("could not rank the fixes of incident %s: %s", inc.id, exc)
                self._ranked[inc.id] = (inc.fixes, {"withheld": f"the model failed: {exc}"})
            finally:
                self._ranking.discard(inc.id)
        for alert in batch.alerts:
            ranked = self._ranked.get(alert["annotations"]["incident_id"])
            if ranked is not None:
                notes = alert["annotations"]
                for key in [k for k in notes if k.startswith("fix")]:
                    del notes[key]
                notes.update(fix_annotations(*ranked))

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            self._rank(batch)
            alerts = batch.alerts
            body = json.dumps(alerts).encode()
            for url in self.urls:
                try:
                    self.post(url, body, self.timeout_s)
                except (OSError, urllib.error.HTTPError, ValueError) as exc:
                    self.status[url]["failed"] += len(alerts)
                    self.status[url]["last_error"] = _describe(exc, url)
                    self.count(url, "failed", len(alerts))
                    log.warning("could not send %d alerts: %s", len(alerts), self.status[url]["last_error"])
                else:
                    self.status[url]["sent"] += len(alerts)
                    self.count(url, "sent", len(alerts))

    def close(self, timeout_s: float = 15.0) -> None:
        """Send what is queued (bounded by `timeout_s`), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)


def _describe(exc: BaseException, url: str) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        detail = exc.read(300).decode("utf-8", "replace").strip()
        return f"{url} answered {exc.code}: {detail or exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return f"{url} did not answer ({exc.reason}): is Alertmanager running there?"
    return f"{url}: {type(exc).__name__}: {exc}"
