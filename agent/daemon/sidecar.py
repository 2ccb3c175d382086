"""The sidecar daemon: collectors on a schedule -> one writer thread -> the store (+ rules, API, own metrics).

Collection runs on the daemon's clock (`schedule.py`: one job per collector, never overlapping itself;
the targets' scrapes on the clock's own asyncio loop, the other collectors on a thread pool);
a single writer thread owns every write to DuckDB, so a tick is one transaction and nothing
else ever holds the write path.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_sentinel.agent.daemon.api import ApiServer
from vllm_sentinel.agent.daemon.cpu_budget import CpuBudget
from vllm_sentinel.agent.daemon.committer import Committer
from vllm_sentinel.agent.daemon.ownhttp import serve_own_http
from vllm_sentinel.agent.daemon.schedule import Schedule
from vllm_sentinel.agent.daemon.selfmetrics import SelfMetrics
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch, Collector, CollectorStatus, Event, now_ms

log = logging.getLogger("vllm_sentinel.sidecar")

DAY_MS = 86_400_000
GATHER_FRACTION = 0.2  # a tick's batches are gathered for a fifth of the interval before one commit
GATHER_MAX_S = 0.25
WRITER_STUCK_S = 120.0
POOL_WORKERS = 8  # the writer goes round every 0.2 s; this long without is a commit that never returns


@dataclass
class SidecarConfig:
    """How often to collect, evaluate and clean up, and where to serve."""

    interval_s: float = 1.0
    eval_interval_s: float = 5.0
    retention_ms: int = 7 * DAY_MS
    maintenance_interval_s: float = 60.0
    socket_path: Path | None = None
    metrics_port: int | None = 9464  # None: do not serve the sidecar's own /metrics
    metrics_host: str = "127.0.0.1"
    queue_max_batches: int = 10_000  # bounded memory when the disk stalls
    # hooks the CLI wires in (rules evaluation, extra API routes); the daemon knows nothing of rules
    evaluate: Callable[[Store, int], dict] | None = None
    # other periodic work that writes (config snapshots, ...): (every seconds, name, fn(store, now_ms));
    # it runs on the writer thread, the only thread that writes
    writer_tasks: list[tuple[float, str, Callable[[Store, int], object]]] = field(default_factory=list)
    # periodic work that does not write (re-reading a targets file): (every seconds, name, fn(now_ms)),
    # on the scheduler's threads beside the collectors
    background_tasks: list[tuple[float, str, Callable[[int], object]]] = field(default_factory=list)
    extra_routes: dict[str, Callable[[Store, dict], dict]] = field(default_factory=dict)
    on_stop: list[Callable[[], object]] = field(default_factory=list)  # after the last commit, before close
    status_extra: Callable[[], dict] | None = None
    cpu_budget: CpuBudget | None = None  # sampled every second; stretches the collectors' interval when it says so


class Sidecar:
    """Scrape, store, evaluate and serve, until stop()."""

    def __init__(self, store: Store, collectors: list[Collector], config: SidecarConfig | None = None):
        self.store = store
        self.collectors = collectors
        self.config = config or SidecarConfig()
        self.metrics = SelfMetrics()
        self.statuses: dict[str, CollectorStatus] = {c.name: CollectorStatus(c.name, ok=True, error="not yet run")
                                                     for c in collectors}
        self._last_collect: dict[str, int] = {}
        self._last_start: dict[str, float] = {}  # monotonic start of each collector's last collection
        self._queue: queue.Queue[tuple[str, Batch]] = queue.Queue(maxsize=self.config.queue_max_batches)
        self.committer = Committer(store, self.metrics, self.config.queue_max_batches)
        self._stopping = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="writer", daemon=True)
        # the targets' scrapes wait on the clock's loop; the pool runs the rest (process collectors, NVML,
        # targets files), its threads started only when needed and not more with more targets. A
        # collection still running when its next one is due is skipped, never overlapped (so a hung job
        # holds one worker, no more): that is counted (vllm_sentinel_collections_skipped_total)
        self._scheduler = Schedule(POOL_WORKERS,
                                   on_skip=lambda name: self.metrics.skipped.labels(name).inc())
        self._api: ApiServer | None = None
        self._metrics_server: object | None = None
        self.started_ms = now_ms()
        self.last_evaluation: dict = {}
        self._started = False
        self._writer_beat = time.monotonic()  # the writer's last time round its loop, for /healthz
        # collectors taken out (their target left the targets file) while a collection may still run:
        # what that collection returns is dropped, so nothing lands after the stale markers
        self._retired: weakref.WeakSet = weakref.WeakSet()
        self._enqueue = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the writer, the schedule, the API socket and the own /metrics server."""
        self._writer.start()
        self._started = True
        for c in self.collectors:
            self._schedule(c)
        for every, name, fn in self.config.background_tasks:
            self._scheduler.add(name, lambda fn=fn, name=name: self._guard(name, lambda: fn(now_ms())), every,
                                first_in_s=every)
        if self.config.cpu_budget is not None:
            self._interval_now = self.config.interval_s
            self._budget_announced = False
            self._scheduler.add("cpu budget", self._keep_cpu_budget, 1.0, first_in_s=1.0)
        self._scheduler.start()
        if self.config.socket_path:
            routes = {"/v1/health": self._health, "/v1/status": lambda _p: self.status()}
            for path, fn in self.config.extra_routes.items():
                routes[path] = lambda params, fn=fn: fn(self.store.reader(), params)
            self._api = ApiServer(self.config.socket_path, routes)
            self._api.start()
        if self.config.metrics_port is not None:
            self._metrics_server = serve_own_http(self.metrics.registry, self.liveness, self.readiness,
                                                  self.config.metrics_port, self.config.metrics_host)

    def stop(self) -> None:
        """Stop collecting, commit everything already collected, then close the API (the store stays open)."""
        if self._stopping.is_set():
            return
        self._scheduler.shutdown(wait=True)  # lets a running scrape finish and hand over its batch
        self._stopping.set()
        self._writer.join(timeout=30)
        for c in self.collectors:
            close = getattr(c, "close", None)
            if close:
                self._guard(f"closing {c.name}", close)
        for fn in self.config.on_stop:
            self._guard("stopping", fn)
        if self._api:
            self._api.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()  # type: ignore[attr-defined]
            self._metrics_server.server_close()  # type: ignore[attr-defined]

    def run_forever(self, duration_s: float | None = None) -> None:
        """Run until SIGTERM/SIGINT (or for duration_s), then stop cleanly."""
        done = threading.Event()
        previous = {s: signal.signal(s, lambda *_: done.set()) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            done.wait(timeout=duration_s)
        finally:
            self.stop()
            for s, h in previous.items():
                signal.signal(s, h)

    # -- targets that come and go (a targets file) -------------------------------------------
    def add_collector(self, collector: Collector) -> None:
        """Start collecting from one more collector (its name must be new); works before and after start()."""
        if any(c.name == collector.name for c in self.collectors):
            raise ValueError(f"a collector named {collector.name!r} is already running")
        self.collectors.append(collector)
        self.statuses[collector.name] = CollectorStatus(collector.name, ok=True, error="not yet run")
        if self._started:
            self._schedule(collector)

    def remove_collector(self, name: str) -> None:
        """Stop a collector; a scraped target's series get stale markers (its `retire`), as in Prometheus."""
        collector = next((c for c in self.collectors if c.name == name), None)
        if collector is None:
            return
        if self._started:
            self._scheduler.remove(name)
        with self._enqueue:
            self._retired.add(collector)
            retire = getattr(collector, "retire", None)
            if retire is not None:
                self._put(name, retire(now_ms()))
            self.collectors.remove(collector)
            self.statuses.pop(name, None)
            self._last_collect.pop(name, None)
            self._last_start.pop(name, None)
            for gauge in (self.metrics.target_up, self.metrics.scrape_duration):
                try:
                    gauge.remove(name)  # a gone target's last value must not stand as if it were current
                except KeyError:
                    pass
        close = getattr(collector, "close", None)
        if close:
            self._guard(f"closing {name}", close)

    def _schedule(self, c: Collector) -> None:
        # a collector may ask for a slower cadence than the scrape interval (process discovery)
        every = max(getattr(self, "_interval_now", self.config.interval_s), getattr(c, "interval_s", 0) or 0)
        collect_async = getattr(c, "collect_async", None)
        if collect_async is not None:  # a scrape that waits on the clock's loop, not on a thread of its own
            self._scheduler.add(c.name, lambda: self._collect_one_async(c, collect_async), every, on_loop=True)
        else:
            self._scheduler.add(c.name, lambda: self._collect_one(c), every)

    # -- work --------------------------------------------------------------------------------
    def _keep_cpu_budget(self) -> None:
        """Sample the CPU budget; reschedule the collectors when the interval it allows changes."""
        assert self.config.cpu_budget is not None
        interval = self.config.cpu_budget.sample()
        if interval == self._interval_now:
            return
        self._interval_now = interval
        for c in list(self.collectors):  # a targets file may add or remove some meanwhile
            # False for one removed since the list was taken
            self._scheduler.reschedule(c.name, max(interval, getattr(c, "interval_s", 0) or 0))
        # the first stretch is news; every later step (it moves by halves and doubles) only repeats it: status
        # and the daemon's own metrics carry the current interval, and a run's end sums it up
        first = not self._budget_announced and interval != self.config.cpu_budget.base_interval_s
        self._budget_announced = self._budget_announced or first
        doc = self.config.cpu_budget.status()
        (log.warning if first else log.info)(
            "cpu budget: collecting every %gs instead of %gs: the daemon used %.1f%% of one core (budget %g%%) on a "
            "host %.0f%% busy; captures and reports wait while it is over", interval, doc["interval_s"],
            doc["used"] * 100, doc["budget"] * 100, doc["host_busy"] * 100)

    def _collect_one(self, collector: Collector) -> None:
        t0 = self._starting(collector)
        try:
            batch = collector.collect(now_ms())
        except Exception as e:  # a collector must not raise; if one does, the daemon survives it
            self._raised(collector, e)
            return
        self._collected(collector, batch, t0)

    async def _collect_one_async(self, collector: Collector, collect_async) -> None:
        t0 = self._starting(collector)
        try:
            batch = await collect_async(now_ms())
        except Exception as e:  # a collector must not raise; if one does, the daemon survives it
            self._raised(collector, e)
            return
        self._collected(collector, batch, t0)

    def _starting(self, collector: Collector) -> float:
        """The collection's start, its gap since the last one observed."""
        t0 = time.monotonic()
        previous_start = self._last_start.get(collector.name)
        self._last_start[collector.name] = t0
        if previous_start is not None:
            self.metrics.collection_gap.labels(collector.name).observe(t0 - previous_start)
        return t0

    def _raised(self, collector: Collector, e: Exception) -> None:
        log.exception("collector %s raised", collector.name)
        with self._enqueue:
            if collector not in self._retired:
                self.statuses[collector.name] = CollectorStatus(collector.name, ok=False,
                                                                error=f"{type(e).__name__}: {e}")
        self.metrics.scrapes.labels(collector.name, "error").inc()

    def _collected(self, collector: Collector, batch: Batch, t0: float) -> None:
        took = time.monotonic() - t0
        status = batch.status or CollectorStatus(collector.name)
        with self._enqueue:  # a collector retired meanwhile leaves no status, gauge or batch behind
            if collector in self._retired:
                return
            previous = self.statuses.get(collector.name)
            if not status.ok and (previous is None or previous.ok or previous.error != status.error):
                # the store keeps each new error once (not every tick), so diagnose can say why a target was down
                batch.events.append(Event(batch.ts_ms, batch.instance, "scrape_error",
                                          {"collector": collector.name}, status.error or "failed"))
            self.statuses[collector.name] = status
            self._last_collect[collector.name] = batch.ts_ms
            self.metrics.scrape_duration.labels(collector.name).set(took)
            self.metrics.target_up.labels(collector.name).set(1 if status.ok else 0)
            self.metrics.scrapes.labels(collector.name, "ok" if status.ok else "error").inc()
            self._put(collector.name, batch)

    def _put(self, name: str, batch: Batch) -> None:
        try:
            self._queue.put_nowait((name, batch))
        except queue.Full:
            self.metrics.dropped_batches.inc()
            log.warning("store is behind; dropped a batch of %s", name)

    def _write_loop(self) -> None:
        next_eval = time.monotonic() + self.config.eval_interval_s
        next_maint = time.monotonic()
        next_task = [time.monotonic() + every for every, _n, _f in self.config.writer_tasks]
        while True:
            self._writer_beat = time.monotonic()
            batches = self._gather()
            if batches or self.committer.due():
                self._commit(batches)
            elif self._stopping.is_set():
                self.committer.at_stop()
                return
            t = time.monotonic()
            if self.config.evaluate and t >= next_eval:
                next_eval = t + self.config.eval_interval_s
                self._guard("evaluate", lambda: self._evaluate())
            if t >= next_maint:
                next_maint = t + self.config.maintenance_interval_s
                self._guard("maintenance", self._maintain)
            for i, (every, name, fn) in enumerate(self.config.writer_tasks):
                if t >= next_task[i]:
                    next_task[i] = t + every
                    self._guard(name, lambda fn=fn: fn(self.store, now_ms()))

    def _gather(self) -> list[tuple[str, Batch]]:
        """The batches of one tick: what arrives within GATHER_FRACTION of an interval of the first.

        The targets' scrapes end a few milliseconds apart (jitter, network); committing them as one
        transaction instead of one each costs a seventh of the CPU (DuckDB's fixed cost per commit).
        """
        try:
            batches = [self._queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + min(GATHER_FRACTION * self.config.interval_s, GATHER_MAX_S)
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            try:
                batches.append(self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait())
            except queue.Empty:
                break
        while True:  # what is already queued goes in too, deadline or not
            try:
                batches.append(self._queue.get_nowait())
            except queue.Empty:
                return batches

    def _commit(self, batches: list[tuple[str, Batch]]) -> None:
        t0 = time.monotonic()
        n = self.committer.commit(batches)  # never raises: failures are pinned on a collector or the store
        self.metrics.commit_seconds.observe(time.monotonic() - t0)
        self.metrics.samples_stored.inc(n)
        self.metrics.series.set(self.store.series_count)

    def _evaluate(self) -> None:
        assert self.config.evaluate is not None
        result = self.config.evaluate(self.store, now_ms())
        self.last_evaluation = result or {}
        active = self.last_evaluation.get("active", {})
        self.metrics.incidents_active.clear()
        for (incident, severity), n in active.items():
            self.metrics.incidents_active.labels(incident, severity).set(n)
        if self.last_evaluation.get("desired_replicas") is not None:
            self.metrics.set_desired_replicas(self.last_evaluation["desired_replicas"])

    def _maintain(self) -> None:
        now = now_ms()
        dropped = self.store.drop_before(now - self.config.retention_ms)
        if dropped:
            log.info("retention dropped %s", ", ".join(dropped))
        self.store.sort_closed(now)
        self.store.roll_up(now)  # long windows (diagnose --since 24h) read these instead of every sample

    def _guard(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:
            log.exception("%s failed; the daemon keeps running", what)

    # -- introspection -----------------------------------------------------------------------
    def liveness(self) -> dict[str, dict]:
        """/healthz: the writer and the scheduler are alive and the writer is not stuck in one commit."""
        quiet_s = time.monotonic() - self._writer_beat
        return {
            "writer": {"ok": self._writer.is_alive() and quiet_s < WRITER_STUCK_S,
                       "detail": (f"last round {quiet_s:.1f}s ago" if self._writer.is_alive()
                                  else "the writer thread has stopped")},
            "scheduler": {"ok": bool(self._scheduler.running), "detail": "running" if self._scheduler.running
                          else "stopped"},
        }

    def readiness(self) -> dict[str, dict]:
        """/readyz: every collector has run once and the store can write (a target being down is not counted)."""
        waiting = [name for name, s in list(self.statuses.items()) if s.error == "not yet run"]
        store = self.committer.status()
        return {
            "started": {"ok": self._started and not self._stopping.is_set(),
                        "detail": "stopping" if self._stopping.is_set() else "started" if self._started else "starting"},
            "first_collection": {"ok": not waiting, "detail": f"waiting for {', '.join(waiting)}" if waiting else "done"},
            "store": {"ok": bool(store["ok"]), "detail": store["error"] or "writable"},
        }

    def _health(self, _params: dict) -> dict:
        return {"ok": True, "pid": os.getpid(), "db": self.store.path, "started_ms": self.started_ms}

    def status(self) -> dict:
        """Targets and collectors with their health, for `vllm-sentinel status`."""
        extra = self.config.status_extra() if self.config.status_extra else {}
        return {**extra,
            "db": self.store.path,
            "started_ms": self.started_ms,
            "interval_s": self.config.interval_s,
            "queue": self._queue.qsize(),
            "store": self.committer.status(),
            "collectors": [self._collector_status(name, s) for name, s in list(self.statuses.items())],
        }

    def _collector_status(self, name: str, s: CollectorStatus) -> dict:
        # a collector that scrapes fine but whose samples are refused (or not written) is degraded, not ok
        issue = self.committer.collector_issue(name)
        state = "failing" if not s.ok else "degraded" if issue else "ok"
        error = "; ".join(x for x in (s.error if not s.ok else None, issue) if x) or s.error
        return {"name": name, "ok": state == "ok", "state": state, "error": error,
                "last_ms": self._last_collect.get(name), "detail": s.detail}

