"""The sidecar's clock: every job on its own cadence, run on a pool, never overlapping itself.

One thread sleeps until the next job is due and hands it to the pool. A job still running when it
is due again is skipped and counted, never stacked behind itself: a stalled target must not pile
up scrapes. A job that fell behind runs once and then keeps its cadence from then on.

At 16 targets scraped every second, a general-purpose scheduler (job stores, triggers with time
zones, an event per run) took about a tenth of the daemon's CPU; this takes a dictionary walk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger("vllm_sentinel.sidecar")

FIRST_RUN_S = 0.05  # a job's first run: right after it is added, not one interval later


@dataclass
class _Job:
    name: str
    fn: Callable[[], object]
    every_s: float
    due: float  # monotonic time of the next run
    running: bool = False


class Schedule:
    """Named jobs, each every `every_s` seconds on a thread pool; thread-safe."""

    def __init__(self, workers: int, on_skip: Callable[[str], None] = lambda _name: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._jobs: dict[str, _Job] = {}
        self._cond = threading.Condition()
        self._clock = clock
        self._on_skip = on_skip
        # threads start only when jobs overlap: a one-target daemon runs a few
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="collect")
        self._thread = threading.Thread(target=self._loop, name="schedule", daemon=True)
        self._stopping = False

    def add(self, name: str, fn: Callable[[], object], every_s: float, first_in_s: float = FIRST_RUN_S) -> None:
        """Run fn every every_s seconds, the first time first_in_s from now; ValueError if the name is taken."""
        if every_s <= 0:
            raise ValueError(f"job {name!r}: the interval must be positive, got {every_s}")
        with self._cond:
            if name in self._jobs:
                raise ValueError(f"a job named {name!r} is already scheduled")
            self._jobs[name] = _Job(name, fn, every_s, self._clock() + first_in_s)
            self._cond.notify()

    def remove(self, name: str) -> bool:
        """Stop scheduling a job (a run in progress finishes); False if there was none of that name."""
        with self._cond:
            return self._jobs.pop(name, None) is not None

    def reschedule(self, name: str, every_s: float) -> bool:
        """A job's new interval, its next run one new interval from now; False if there is no such job."""
        with self._cond:
            job = self._jobs.get(name)
            if job is None:
                return False
            job.every_s, job.due = every_s, self._clock() + every_s
            self._cond.notify()
            return True

    def every(self, name: str) -> float | None:
        """A job's interval in seconds; None if there is no such job."""
        with self._cond:
            job = self._jobs.get(name)
            return None if job is None else job.every_s

    @property
    def running(self) -> bool:
        """True from start() until shutdown()."""
        return self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        """Start the clock thread."""
        self._thread.start()

    def shutdown(self, wait: bool = True) -> None:
        """Stop starting jobs; with wait, return once the runs in progress have finished."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=wait)

    def _loop(self) -> None:
        with self._cond:
            while not self._stopping:
                now = self._clock()
                for job in list(self._jobs.values()):
                    if job.due > now:
                        continue
                    job.due += job.every_s
                    if job.due <= now:  # fell behind (a stall, a suspended host): once now, then on cadence
                        job.due = now + job.every_s
                    if job.running:
                        self._on_skip(job.name)
                        continue
                    job.running = True
                    self._pool.submit(self._run, job)
                wait = min((j.due for j in self._jobs.values()), default=now + 1.0) - self._clock()
                if wait > 0:
                    self._cond.wait(timeout=wait)

    def _run(self, job: _Job) -> None:
        try:
            job.fn()
        except Exception:  # a job must not raise; if one does, its schedule goes on
            log.exception("%s failed; the daemon keeps running", job.name)
        finally:
            with self._cond:
                job.running = False
