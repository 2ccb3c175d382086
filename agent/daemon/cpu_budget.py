"""The daemon's CPU budget (`run --cpu-budget`): measure its own CPU over a sliding window, defer
optional work while it is over budget, and stretch the scrape interval while it is over budget on a
saturated host.

The sidecar shares its host with vLLM, whose API server and engine core want every cycle under
load. Scraping is the daemon's job and is never skipped; stack captures, vLLM profiler runs and
report writing are bursts of CPU that can wait: they are deferred (counted, and retried by their
owner) until the daemon is back under budget. Host saturation alone does not defer them: vLLM's
CPU backend keeps every core busy all the time (its engine core busy-waits), so a host-load test
would defer them forever.
"""

from __future__ import annotations

import math
import resource
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from vllm_sentinel.reports.chart_process import child_cpu_seconds

# 10 % of one core. Measured on a 2-vCPU VM: 16 targets at 1 s with the shipped rules cost the daemon
# 53 % of a core (bench/soak.py), about 3.3 % per target; one target at 0.5 s with evaluation every
# 1 s, 6.3 %. At 5 % the common one-target daemon would defer every report; 10 % keeps it, and a
# report's chart burst (1-3 s of CPU, i.e. up to 10 % of the 30 s window), within budget
DEFAULT_BUDGET = 0.10
WINDOW_S = 30.0  # long enough to smooth one evaluation or report burst, short enough to react within a minute
SATURATED_AT = 0.90  # host busy fraction (all cores) from which vLLM is short of CPU
MAX_STRETCH = 8  # at most 8x the configured interval: 1 s -> 8 s keeps rules with 1 m windows meaningful
WORKS = ("capture", "profiler", "report")


def parse_budget(text: str) -> float:
    """'5%' or '0.05' -> a fraction of one core; ValueError naming the fix."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value <= 1):  # a bare 5 is refused, not guessed: 5 % and 500 % are both plausible typos
        raise ValueError(f"--cpu-budget {text!r}: give a share of one core above 0 and at most 100 %, "
                         "e.g. --cpu-budget 5% or --cpu-budget 0.05")
    return value


def self_cpu_seconds() -> float:
    """This process's user+system CPU seconds, all threads, plus what its report charts' processes used."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    # charts drawn in a child are still the daemon's work on vLLM's host. Not RUSAGE_CHILDREN: the demo
    # runs vLLM as a child of the daemon's process, and a restarted server's minutes of CPU would land at once
    return own.ru_utime + own.ru_stime + child_cpu_seconds()


def host_cpu_jiffies(path: Path = Path("/proc/stat")) -> tuple[float, float] | None:
    """(busy, total) jiffies of all cores from /proc/stat; None where there is none (not Linux)."""
    try:
        first = path.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    values = [float(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(values)
    return total - values[3] - values[4], total


@dataclass
class Reading:
    t: float
    self_cpu_s: float
    host: tuple[float, float] | None


class CpuBudget:
    """A sliding-window accountant of the daemon's CPU against its budget; thread-safe."""

    def __init__(self, budget: float = DEFAULT_BUDGET, base_interval_s: float = 1.0, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, read_self: Callable[[], float] = self_cpu_seconds,
                 read_host: Callable[[], tuple[float, float] | None] = host_cpu_jiffies,
                 saturated_at: float = SATURATED_AT, max_stretch: int = MAX_STRETCH):
        self.budget = budget
        self.base_interval_s = base_interval_s
        self.window_s = window_s
        self.clock, self.read_self, self.read_host = clock, read_self, read_host
        self.saturated_at = saturated_at
        self.max_stretch = max_stretch
        self.stretch = 1  # the interval is base_interval_s * stretch
        self.widest_stretch = 1  # since the start: the end-of-run summary says how far it went
        self.peak_used = 0.0  # the most the window's use reached at an adjustment, a fraction of one core
        self.hold_s = window_s / 3  # between two changes of the stretch: let the window see the last one
        self.deferred: dict[str, int] = {w: 0 for w in WORKS}
        self.on_defer: Callable[[str], object] | None = None  # the own metrics' counter
        self._readings: deque[Reading] = deque()
        self._lock = threading.Lock()
        self._changed_at = -math.inf
        self.sample()

    def measure_with(self, read_self: Callable[[], float]) -> None:
        """Count the daemon's CPU with `read_self` from now on (a process that also runs other work, such as
        the demo's load, counts only the daemon's part); the window starts again."""
        with self._lock:
            self.read_self = read_self
            self._readings.clear()
        self.sample()

    def sample(self) -> float:
        """Take a reading, drop those older than the window, adjust the stretch; returns the interval."""
        reading = Reading(self.clock(), self.read_self(), self.read_host())
        with self._lock:
            self._readings.append(reading)
            # keep one reading at or before the window's start, so the window is always covered
            while len(self._readings) > 2 and self._readings[1].t <= reading.t - self.window_s:
                self._readings.popleft()
            # a change needs hold_s of readings since start and since the last change: no reaction to one burst
            seen = reading.t - self._readings[0].t
            if seen >= self.hold_s and reading.t - self._changed_at >= self.hold_s:
                self._adjust(reading.t)
        return self.interval_s()

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        """Publish vllm_sentinel_cpu_budget_ratio, _cpu_used_ratio, _effective_interval_seconds and
        _deferred_total{work} in the daemon's own registry."""
        Gauge("vllm_sentinel_cpu_budget_ratio", "The daemon's CPU budget, as a fraction of one core",
              registry=registry).set(self.budget)
        Gauge("vllm_sentinel_cpu_used_ratio", "The daemon's CPU over the budget window, as a fraction of one core",
              registry=registry).set_function(lambda: self.status()["used"])
        Gauge("vllm_sentinel_effective_interval_seconds", "The collection interval now (stretched on a saturated host)",
              registry=registry).set_function(self.interval_s)
        deferred = Counter("vllm_sentinel_deferred", "Optional work deferred to keep the CPU budget", ["work"],
                           registry=registry)
        for work in WORKS:
            deferred.labels(work)  # present at 0, so a rate() over it works from the start
        self.on_defer = lambda work: deferred.labels(work).inc()

    def _adjust(self, t: float) -> None:
        before = self.stretch
        self.peak_used = max(self.peak_used, self.used())
        over, saturated = self.used() > self.budget, self.host_busy() >= self.saturated_at
        if over and saturated:
            self.stretch = min(self.max_stretch, self.stretch * 2)
        elif self.stretch > 1 and (not saturated or self.used() * 2 < self.budget):
            self.stretch //= 2  # back one step at a time: a host that recovers briefly does not flap
        if self.stretch != before:
            self._changed_at = t
        self.widest_stretch = max(self.widest_stretch, self.stretch)

    def used(self) -> float:
        """The daemon's CPU over the window, as a fraction of one core (0 before two readings)."""
        first, last = self._readings[0], self._readings[-1]
        span = last.t - first.t
        return (last.self_cpu_s - first.self_cpu_s) / span if span > 0 else 0.0

    def host_busy(self) -> float:
        """The host's busy fraction of all cores over the window (0 where unknown)."""
        first, last = self._readings[0].host, self._readings[-1].host
        if first is None or last is None or last[1] <= first[1]:
            return 0.0
        return (last[0] - first[0]) / (last[1] - first[1])

    def interval_s(self) -> float:
        """The scrape interval now: the configured one, stretched while over budget on a saturated host."""
        return self.base_interval_s * self.stretch

    def allow(self, work: str, retry: bool = False) -> bool:
        """May optional `work` (capture, profiler, report) run now? A refusal is counted once per item (not on retry)."""
        with self._lock:
            ok = self.used() <= self.budget
            if not ok and not retry:
                self.deferred[work] = self.deferred.get(work, 0) + 1
        if not ok and not retry and self.on_defer is not None:
            self.on_defer(work)
        return ok

    def status(self) -> dict:
        """For `status`: use, budget, host load, interval and deferred work, with a one-line summary."""
        with self._lock:
            used, busy = self.used(), self.host_busy()
        doc = {"used": round(used, 4), "budget": self.budget, "host_busy": round(busy, 4),
               "interval_s": self.base_interval_s, "effective_interval_s": self.interval_s(),
               "deferred": dict(self.deferred), "widest_interval_s": self.base_interval_s * self.widest_stretch,
               "peak_used": round(self.peak_used, 4)}
        doc["summary"] = self.summary(doc)
        return doc

    @staticmethod
    def run_summary(doc: dict) -> str:
        """The whole run in one line, from a status() document: how far the interval stretched, what was
        deferred, and the --cpu-budget that would have avoided both; '' when neither happened."""
        deferred = [f"{n} {w}{'s' if n > 1 else ''}" for w, n in doc["deferred"].items() if n]
        widest = doc.get("widest_interval_s", doc["interval_s"])
        if not deferred and widest == doc["interval_s"]:
            return ""
        parts = []
        if widest != doc["interval_s"]:
            parts.append(f"collection stretched from every {doc['interval_s']:g}s to every {widest:g}s at most")
        if deferred:
            parts.append(f"deferred {', '.join(deferred)}")
        peak = max(doc.get("peak_used", 0.0), doc["used"])
        host = " on a saturated host" if widest != doc["interval_s"] else ""  # only a saturated host stretches
        return (f"cpu budget {doc['budget'] * 100:g}% of one core, the daemon used up to {peak * 100:.0f}%{host}: "
                f"{'; '.join(parts)}. --cpu-budget {max(math.ceil(peak * 125), 1)}% would have avoided it")

    @staticmethod
    def summary(doc: dict) -> str:
        """'cpu 3.2% of one core, budget 5%, interval 1s -> 2s (host 97% busy), 3 captures deferred'."""
        line = f"cpu {doc['used'] * 100:.1f}% of one core, budget {doc['budget'] * 100:g}%"
        if doc["effective_interval_s"] != doc["interval_s"]:
            line += (f", interval stretched {doc['interval_s']:g}s -> {doc['effective_interval_s']:g}s "
                     f"(host {doc['host_busy'] * 100:.0f}% busy)")
        for work, n in doc["deferred"].items():
            if n:
                line += f", {n} {work}{'s' if n > 1 else ''} deferred"
        if doc["used"] > doc["budget"]:
            line += (f"; over budget: captures and reports wait; if scraping alone needs more, raise "
                     f"--cpu-budget to {math.ceil(doc['used'] * 125)}% or lengthen --interval")
        return line
