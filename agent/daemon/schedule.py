"""The sidecar's clock: every job on its own cadence, never overlapping itself.

One thread runs an asyncio loop that is both the clock and the scrapes' I/O: a job whose function
returns an awaitable (a target's scrape) runs on that loop, every other job on a thread pool. A job
still running when it is due again is skipped and counted, never stacked behind itself: a stalled
target must not pile up scrapes. A job that fell behind runs once and then keeps its cadence.

At 16 targets scraped every second, a general-purpose scheduler (job stores, triggers with time
zones, an event per run) took about a tenth of the daemon's CPU, and a thread per scrape more than
the scrape: waking and switching 16 threads every second cost about as much as their HTTP and parsing.
"""

from __future__ import annotations

import asyncio
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
    due: float  # the clock's time of the next run
    on_loop: bool = False  # fn returns an awaitable, run on the clock's loop
    running: bool = False


class Schedule:
    """Named jobs, each every `every_s` seconds, on the clock's loop or a thread pool; thread-safe."""

    def __init__(self, workers: int, on_skip: Callable[[str], None] = lambda _name: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._on_skip = on_skip
        # threads start only when jobs overlap: a one-target daemon runs a few
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="collect")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="schedule", daemon=True)
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False

    def add(self, name: str, fn: Callable[[], object], every_s: float, first_in_s: float = FIRST_RUN_S,
            on_loop: bool = False) -> None:
        """Run fn every every_s seconds, the first time first_in_s from now; ValueError if the name is taken.

        With on_loop, fn returns an awaitable that runs on the clock's own loop: it must never block.
        """
        if every_s <= 0:
            raise ValueError(f"job {name!r}: the interval must be positive, got {every_s}")
        with self._lock:
            if name in self._jobs:
                raise ValueError(f"a job named {name!r} is already scheduled")
            self._jobs[name] = _Job(name, fn, every_s, self._clock() + first_in_s, on_loop)
        self.wake()

    def remove(self, name: str) -> bool:
        """Stop scheduling a job (a run in progress finishes); False if there was none of that name."""
        with self._lock:
            return self._jobs.pop(name, None) is not None

    def reschedule(self, name: str, every_s: float) -> bool:
        """A job's new interval, its next run one new interval from now; False if there is no such job."""
        with self._lock:
            job = self._jobs.get(name)
            if job is None:
                return False
            job.every_s, job.due = every_s, self._clock() + every_s
        self.wake()
        return True

    def every(self, name: str) -> float | None:
        """A job's interval in seconds; None if there is no such job."""
        with self._lock:
            job = self._jobs.get(name)
            return None if job is None else job.every_s

    @property
    def running(self) -> bool:
        """True from start() until shutdown()."""
        return self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        """Start the clock thread."""
        self._thread.start()

    def wake(self) -> None:
        """Look at the jobs now (after a change, or when the clock given to the constructor jumped)."""
        if self._thread.is_alive() and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._tick)
            except RuntimeError:  # the loop closed meanwhile: shutting down
                pass

    def shutdown(self, wait: bool = True) -> None:
        """Stop starting jobs; with wait, return once the runs in progress have finished."""
        with self._lock:
            self._stopping = True
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._stop(wait), loop=self._loop))
            self._thread.join()
        self._pool.shutdown(wait=wait)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._tick)
        self._loop.run_forever()
        # the loop stays open, stopped: a kept connection closed later runs it once to close its socket

    async def _stop(self, wait: bool) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._tasks:
            if not wait:
                for task in self._tasks:
                    task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._loop.stop()

    def _tick(self) -> None:
        with self._lock:
            if self._stopping:
                return
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
                if job.on_loop:
                    task = self._loop.create_task(self._run_on_loop(job))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    self._pool.submit(self._run, job)
            wait = min((j.due for j in self._jobs.values()), default=now + 1.0) - self._clock()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(max(wait, 0.0), self._tick)

    async def _run_on_loop(self, job: _Job) -> None:
        try:
            await job.fn()  # type: ignore[misc]
        except Exception:  # a job must not raise; if one does, its schedule goes on
            log.exception("%s failed; the daemon keeps running", job.name)
        finally:
            with self._lock:
                job.running = False

    def _run(self, job: _Job) -> None:
        try:
            job.fn()
        except Exception:  # a job must not raise; if one does, its schedule goes on
            log.exception("%s failed; the daemon keeps running", job.name)
        finally:
            with self._lock:
                job.running = False
