"""The writer's commit path: one transaction per tick, and what happens when a commit fails.

A tick's batches are committed together. Samples the store refuses are dropped alone and pinned on
the collector that sent them; when the tick still fails, each collector's batch is retried alone so
the good ones land and the failure is pinned on the batch that caused it. When the file cannot be
written at all (disk full) the batches are held in memory, bounded, and committed once it can.
"""

from __future__ import annotations

import logging
import time

from vllm_sentinel.agent.daemon.selfmetrics import SelfMetrics
from vllm_sentinel.agent.store.db import Store, StoreUnwritable
from vllm_sentinel.agent.store.sample_checks import Rejected
from vllm_sentinel.collectors.base import Batch, now_ms

log = logging.getLogger("vllm_sentinel.sidecar")

Item = tuple[str, Batch]  # (collector name, its batch)
RETRY_S = 1.0  # how often a store that cannot write is tried again
REMIND_S = 30.0  # while it lasts, the log says so again this often


class Committer:
    """Commits ticks for the writer thread and keeps what `status` says about storing."""

    def __init__(self, store: Store, metrics: SelfMetrics, max_held: int):
        self.store = store
        self.metrics = metrics
        self.max_held = max_held
        self.issues: dict[str, str] = {}  # collector -> why its last batch was not stored whole
        self.held: list[Item] = []
        self.store_error: str | None = None
        self.error_since_ms: int | None = None
        self.lost_batches = 0
        self._retry_at = 0.0
        self._reminded = 0.0
        self.metrics.store_writable.set(1)

    def due(self) -> bool:
        """True when held batches should be tried again now."""
        return bool(self.held) and time.monotonic() >= self._retry_at

    def commit(self, items: list[Item]) -> int:
        """Commit one tick (plus any held batches when due); returns the samples stored."""
        if self.held:
            if time.monotonic() < self._retry_at:
                self._hold(items)
                return 0
            items, self.held = self.held + items, []
        if not items:
            return 0
        rejected: list[Rejected] = []
        try:
            n = self.store.append_many([b for _name, b in items], rejected)
        except StoreUnwritable as e:
            self._unwritable(items, e)
            return 0
        except Exception:  # noqa: BLE001 - which batch broke the tick is found by committing each alone
            log.warning("commit of %d batches failed; committing each collector's batch alone", len(items))
            return self._one_by_one(items)
        self._stored(items, rejected)
        return n

    def _one_by_one(self, items: list[Item]) -> int:
        stored = 0
        for i, (name, batch) in enumerate(items):
            rejected: list[Rejected] = []
            try:
                stored += self.store.append_many([batch], rejected)
            except StoreUnwritable as e:
                self._unwritable(items[i:], e)
                return stored
            except Exception as e:  # noqa: BLE001 - pinned on this collector, the others still land
                self._batch_failed(name, batch, e)
                continue
            self._stored([(name, batch)], rejected)
        return stored

    def _stored(self, items: list[Item], rejected: list[Rejected]) -> None:
        if self.store_error is not None:
            log.warning("the store can write again after %.0f s; %d held and new batches committed",
                        (now_ms() - (self.error_since_ms or now_ms())) / 1000, len(items))
            self.store_error = self.error_since_ms = None
            self.metrics.store_writable.set(1)
        by_batch: dict[int, list[Rejected]] = {}
        for r in rejected:
            by_batch.setdefault(r.batch, []).append(r)
        for i, (name, _batch) in enumerate(items):
            refused = by_batch.get(i)
            if not refused:
                self.issues.pop(name, None)
                self.metrics.target_stored.labels(name).set(1)
                continue
            message = "; ".join(r.message for r in refused)
            if self.issues.get(name) != message:
                log.warning("%s: %s", name, message)
            self.issues[name] = message
            self.metrics.target_stored.labels(name).set(0)
            for r in refused:
                self.metrics.samples_rejected.labels(name, r.reason).inc(r.count)
        self.metrics.batches_held.set(len(self.held))

    def _batch_failed(self, name: str, batch: Batch, e: Exception) -> None:
        why = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        message = (f"its batch of {len(batch)} samples could not be stored and was dropped ({why}); "
                   "the other collectors' data was stored. Run with -v for the details")
        if self.issues.get(name) != message:
            log.error("%s: %s", name, message, exc_info=e)
        self.issues[name] = message
        self.metrics.store_errors.inc()
        self.metrics.batches_failed.labels(name).inc()
        self.metrics.target_stored.labels(name).set(0)

    def _unwritable(self, items: list[Item], e: StoreUnwritable) -> None:
        self.metrics.store_errors.inc()
        self.metrics.store_writable.set(0)
        self._retry_at = time.monotonic() + RETRY_S
        first = self.store_error is None
        self.store_error = str(e)
        if first:
            self.error_since_ms = now_ms()
        self._hold(items)
        t = time.monotonic()
        if first or t - self._reminded >= REMIND_S:
            self._reminded = t
            log.error("%s; %d batches held in memory (at most %d, then the oldest are dropped)",
                      self.store_error, len(self.held), self.max_held)

    def _hold(self, items: list[Item]) -> None:
        self.held.extend(items)
        over = len(self.held) - self.max_held
        if over > 0:
            del self.held[:over]
            self.lost_batches += over
            self.metrics.dropped_batches.inc(over)
        self.metrics.batches_held.set(len(self.held))

    def at_stop(self) -> None:
        """Last try for held batches when the daemon stops; what still cannot be written is said, not hidden."""
        if not self.held:
            return
        self._retry_at = 0.0
        self.commit([])
        if self.held:
            log.error("stopping with the store still unwritable: %d collected batches were not stored",
                      len(self.held))

    def status(self) -> dict:
        """The store part of `status`: can it write, since when, what is held or was lost."""
        return {"ok": self.store_error is None, "error": self.store_error, "since_ms": self.error_since_ms,
                "held_batches": len(self.held), "lost_batches": self.lost_batches}

    def collector_issue(self, name: str) -> str | None:
        """Why this collector's data is not (all) being stored, or None."""
        if self.store_error is not None:
            return "not stored yet: the store cannot write (see store above); held in memory until it can"
        return self.issues.get(name)
