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
from dataclasses import dataclass

from vllm_sentinel.agent.diagnosis.incidents import Incident
from vllm_sentinel.collectors.timefmt import iso_precise

log = logging.getLogger("vllm_sentinel.alertmanager")

RESEND_S = 60.0  # Prometheus' --rules.alert.resend-delay default
RESOLVED_RESEND_MS = 15 * 60_000  # Prometheus keeps resending a resolved alert this long
QUEUE_MAX = 64  # batches waiting to be sent; beyond that the oldest are dropped and counted

# (url, JSON body, timeout) -> None; raises OSError/HTTPError on failure; injectable for tests
Post = Callable[[str, bytes, float], None]
Count = Callable[[str, str, int], None]  # (alertmanager URL, result: sent | failed | dropped, alerts)


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


def to_alert(inc: Incident, now_ms: int, valid_ms: int, generator_url: str = "") -> dict:
    """One PostableAlert: the rule name as alertname, the incident's labels, annotations with its id and fix."""
    labels = {"alertname": inc.rule.name, **{k: str(v) for k, v in inc.labels.items() if k != "__name__"}}
    annotations = {k: str(v) for k, v in inc.annotations.items()}
    annotations["incident_id"] = inc.id
    annotations["report"] = f"vllm-sentinel report {inc.id}"
    fix = next((f for f in inc.fixes if f.get("suggested") not in (None, "")), None)
    if fix is not None:
        current = fix.get("current")
        annotations["fix"] = (f"{fix.get('param')} {current} -> {fix.get('suggested')}" if current not in (None, "")
                              else f"{fix.get('param')} {fix.get('suggested')}")
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


class AlertmanagerNotifier:
    """After each evaluation, queue the alerts that are due; a thread posts them to every Alertmanager."""

    def __init__(self, urls: Iterable[str], *, resend_s: float = RESEND_S, eval_interval_s: float = 5.0,
                 timeout_s: float = 10.0, post: Post = http_post, count: Count | None = None,
                 generator_url: str = "") -> None:
        self.urls = [alerts_url(u) for u in urls]
        self.resend_ms = int(resend_s * 1000)
        # as Prometheus: valid for 4 x max(evaluation interval, resend delay)
        self.valid_ms = 4 * max(int(eval_interval_s * 1000), self.resend_ms)
        self.timeout_s = timeout_s
        self.post = post
        self.count = count or (lambda url, result, n: None)
        self.generator_url = generator_url
        self._firing: dict[str, _Sent] = {}
        self._resolved: dict[str, _Sent] = {}
        self._queue: queue.Queue[list[dict] | None] = queue.Queue(maxsize=QUEUE_MAX)
        self.status: dict[str, dict] = {u: {"sent": 0, "failed": 0, "dropped": 0, "last_error": None} for u in self.urls}
        self._thread = threading.Thread(target=self._run, daemon=True, name="alertmanager")
        self._thread.start()

    def after_evaluation(self, now_ms: int, firing: Iterable[Incident], resolved: Iterable[Incident]) -> None:
        """Queue what is due at `now_ms`: new and resend-due firing incidents, new and retained resolved ones."""
        due: list[dict] = []
        firing_now = {inc.id: inc for inc in firing}
        for iid, inc in firing_now.items():
            sent = self._firing.get(iid)
            if sent is None or now_ms - sent.last_sent_ms >= self.resend_ms:
                due.append(to_alert(inc, now_ms, self.valid_ms, self.generator_url))
                self._firing[iid] = _Sent(inc, now_ms)
        for inc in resolved:
            self._firing.pop(inc.id, None)
            due.append(to_alert(inc, now_ms, self.valid_ms, self.generator_url))
            self._resolved[inc.id] = _Sent(inc, now_ms)
        for iid, sent in list(self._resolved.items()):
            end = sent.incident.end_ms or now_ms
            if now_ms - end > RESOLVED_RESEND_MS:
                del self._resolved[iid]
            elif now_ms - sent.last_sent_ms >= self.resend_ms:
                due.append(to_alert(sent.incident, now_ms, self.valid_ms, self.generator_url))
                sent.last_sent_ms = now_ms
        for iid in [i for i in self._firing if i not in firing_now]:  # gone without a resolve (rule removed)
            del self._firing[iid]
        if due:
            self._enqueue(due)

    def _enqueue(self, alerts: list[dict]) -> None:
        try:
            self._queue.put_nowait(alerts)
        except queue.Full:  # Alertmanager is slower than the rules: drop the oldest batch, keep the newest
            try:
                dropped = self._queue.get_nowait()
                for url in self.urls:
                    self.status[url]["dropped"] += len(dropped or [])
                    self.count(url, "dropped", len(dropped or []))
            except queue.Empty:
                pass
            self._queue.put_nowait(alerts)

    def _run(self) -> None:
        while True:
            alerts = self._queue.get()
            if alerts is None:
                return
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
