"""Write an incident's Markdown report when it fires and again when it resolves, off the writer thread."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from pathlib import Path

from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.reports.chart_process import draw_in_child
from vllm_sentinel.reports.write import report_for_incident

log = logging.getLogger("vllm_sentinel.reports")


class AutoReporter:
    """Hands report writing to one background thread so ingest never waits for it; charts are drawn in a child."""

    def __init__(self, out_dir: Path, rules: list | None = None, max_pending: int = 32,
                 gate: Callable[[str, bool], bool] | None = None):
        self.out_dir = Path(out_dir)
        self.rules = rules
        self.max_pending = max_pending  # bounded: an incident storm must not queue unbounded work
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reports")
        self._pending = 0
        self.written: list[str] = []  # newest last, for `status`
        # gate(work, retry): False while the daemon is over its CPU budget; refused reports wait here
        # (bounded by max_pending) and are written at a later evaluation
        self.gate = gate
        self.deferred: list[str] = []
        self.said: set[str] = set()  # what a report lacked (no charts), logged once per daemon, not per report

    def after_evaluation(self, store: Store, result: dict, now_ms: int) -> None:
        """Queue a report for every incident that opened or resolved in this evaluation (or waits for CPU budget)."""
        waiting, self.deferred = self.deferred, []
        for incident_id in dict.fromkeys(waiting + list(result.get("opened", [])) + list(result.get("resolved", []))):
            if self.gate is not None and not self.gate("report", incident_id in waiting):
                self.deferred = self.deferred[-(self.max_pending - 1):] + [incident_id]
                continue
            if self._pending >= self.max_pending:
                log.warning("report queue full; skipped the report of %s (run `vllm-sentinel report %s`)",
                            incident_id, incident_id)
                continue
            self._pending += 1
            # a reader view: its own cursor and a snapshot of the partitions, safe beside the writer
            self._pool.submit(self._write, store.reader(), incident_id, now_ms)

    def _write(self, store: Store, incident_id: str, now_ms: int) -> None:
        try:
            # matplotlib never loads into the daemon: its ~56 MiB would stay for the daemon's life
            written = report_for_incident(store, incident_id, self.out_dir, now_ms=now_ms, rules=self.rules,
                                          draw=draw_in_child)
            path = str(written.markdown)  # rewritten when the incident resolves: listed once, as the newest
            self.written = ([w for w in self.written if w != path] + [path])[-20:]
            log.info("incident report %s", written.markdown)
            for line in written.missing:
                if line not in self.said:
                    self.said.add(line)
                    log.warning("incident report %s written without %s", written.markdown, line)
        except Exception:
            log.exception("report of %s failed; the daemon keeps running", incident_id)
        finally:
            self._pending -= 1

    def close(self) -> None:
        """Finish the reports already queued (before the store closes)."""
        self._pool.shutdown(wait=True)
