"""The daemon's scrape targets: fixed ones from --target, the others from --targets-file, re-read when it changes.

On a change, new targets start collecting, removed ones stop and their series get stale markers,
and a target whose URL or labels changed is restarted. A file that cannot be read or parsed
leaves the running targets as they are; `status` shows the error until a good version arrives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from vllm_sentinel.agent.daemon.file_sd import TargetsFile, TargetsFileError, TargetSpec
from vllm_sentinel.collectors.base import Collector, now_ms

log = logging.getLogger("vllm_sentinel.targets")

RELOAD_CHECK_S = 2.0  # a stat every 2 s: cheap, and a new replica is scraped within seconds


@dataclass
class Running:
    """A target being collected: its spec and the collectors started for it."""

    spec: TargetSpec
    collectors: list[Collector]


class TargetSet:
    """Keeps the collectors of every target in step with --target and the targets file.

    `start(spec)` builds a target's collectors; `add`/`remove` hand them to the daemon (until the
    daemon exists, they are only collected here and given to it at its construction).
    """

    def __init__(self, static: list[TargetSpec], file: Path | None,
                 start: Callable[[TargetSpec], list[Collector]]) -> None:
        self.static = list(static)
        self.file = TargetsFile(file) if file is not None else None
        self._start = start
        self.running: dict[str, Running] = {}
        self.add: Callable[[Collector], None] | None = None
        self.remove: Callable[[str], None] | None = None
        self.last_reload_ms: int | None = None
        self.last_change_ms: int | None = None
        self.reload_error: str | None = None
        self.reloads = {"ok": 0, "error": 0}
        self._lock = threading.Lock()
        self._metrics: tuple[Counter, Gauge] | None = None

    def initial(self) -> list[Collector]:
        """Read the file (a problem raises TargetsFileError, naming file:line) and start every target."""
        wanted = self.static + (self.file.read() if self.file else [])
        self._check_no_clash(wanted)
        if not wanted:
            raise ValueError("no target: pass --target URL, or a --targets-file that lists at least one target")
        self.last_reload_ms = now_ms()
        for spec in wanted:
            self.running[spec.instance] = Running(spec, self._start(spec))
        return [c for r in self.running.values() for c in r.collectors]

    def bind(self, add: Callable[[Collector], None], remove: Callable[[str], None],
             registry: CollectorRegistry | None = None) -> None:
        """From now on targets are started and stopped through the daemon's add/remove."""
        self.add, self.remove = add, remove
        if registry is not None:
            self._metrics = (
                Counter("vllm_sentinel_targets_file_reloads", "Reads of the targets file after a change, by result",
                        ["result"], registry=registry),
                Gauge("vllm_sentinel_targets", "Targets being collected, by where they came from", ["source"],
                      registry=registry))
            self._count_targets()

    def reload_if_changed(self, now: int | None = None) -> bool:
        """Re-read the targets file if it changed and apply it; True when the set of targets changed."""
        if self.file is None or not self.file.changed():
            return False
        with self._lock:
            return self._reload(now if now is not None else now_ms())

    def _reload(self, now: int) -> bool:
        try:
            specs = self.file.read()
            self._check_no_clash(self.static + specs)
        except (TargetsFileError, ValueError) as e:
            self.reload_error = str(e)
            self.reloads["error"] += 1
            self._count_reload("error")
            log.warning("targets file not applied, the running targets stay: %s", e)
            return False
        self.reload_error = None
        self.last_reload_ms = now
        self.reloads["ok"] += 1
        self._count_reload("ok")
        wanted = {s.instance: s for s in self.static + specs}
        # a target whose URL or labels changed is stopped and started again: its series change too
        gone = [i for i, r in self.running.items() if not self._same_target(r.spec, wanted.get(i))]
        new = [s for i, s in wanted.items() if i not in self.running or i in gone]
        for instance in gone:
            for c in self.running.pop(instance).collectors:
                self.remove(c.name)
        for spec in new:
            collectors = self._start(spec)
            for c in collectors:
                self.add(c)
            self.running[spec.instance] = Running(spec, collectors)
        for instance, spec in wanted.items():  # the same target on another line: only its source moved
            self.running[instance].spec = spec
        if gone or new:
            self.last_change_ms = now
            restarted = len(set(gone) & wanted.keys())
            log.warning("targets file %s: %d target(s) started, %d stopped, %d restarted", self.file.path,
                        len(new) - restarted, len(gone) - restarted, restarted)
        self._count_targets()
        return bool(gone or new)

    @staticmethod
    def _same_target(a: TargetSpec, b: TargetSpec | None) -> bool:
        return b is not None and (a.url, a.instance, a.labels) == (b.url, b.instance, b.labels)

    def _check_no_clash(self, specs: list[TargetSpec]) -> None:
        seen: dict[str, str] = {}
        for s in specs:
            if s.instance in seen:
                raise ValueError(f"{s.source}: target {s.instance} is also given by {seen[s.instance]}; "
                                 "list each target once")
            seen[s.instance] = s.source

    def _count_reload(self, result: str) -> None:
        if self._metrics:
            self._metrics[0].labels(result).inc()

    def _count_targets(self) -> None:
        if self._metrics:
            gauge = self._metrics[1]
            file_n = sum(1 for r in self.running.values() if r.spec.source != "--target")
            gauge.labels("--target").set(len(self.running) - file_n)
            gauge.labels("targets_file").set(file_n)

    def status(self) -> dict:
        """For `status`: every target and where it came from, the file and its last reload (or its error)."""
        return {
            "targets": [{"instance": r.spec.instance, "url": r.spec.url, "source": r.spec.source,
                         "labels": r.spec.label_dict} for r in list(self.running.values())],
            "targets_file": None if self.file is None else {
                "path": str(self.file.path), "last_reload_ms": self.last_reload_ms,
                "last_change_ms": self.last_change_ms, "reloads": dict(self.reloads), "error": self.reload_error},
        }
