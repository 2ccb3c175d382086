"""The demo's sidecar shares its process with the load it watches: its CPU budget must not count the load.

getrusage(RUSAGE_SELF) sums every thread of the process, so the demo's 12-32 client threads would be
charged to the sidecar, which then stretches its scrape interval for CPU it did not use. This reader
takes the process's CPU less that of the load's threads (named traffic-*), read per thread from
/proc/self/task. A thread that has ended keeps the last figure read for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from vllm_sentinel.agent.daemon.cpu_budget import self_cpu_seconds

LOAD_THREAD_PREFIX = "traffic"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu_seconds(native_id: int, task_dir: Path = Path("/proc/self/task")) -> float | None:
    """user+system CPU seconds of one thread of this process; None once it has ended."""
    try:
        fields = (task_dir / str(native_id) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime and stime, fields 14 and 15 of stat


class CpuLessLoad:
    """A CpuBudget `read_self`: this process's CPU seconds less those of its load threads."""

    def __init__(self, read_total: Callable[[], float] = self_cpu_seconds, prefix: str = LOAD_THREAD_PREFIX,
                 threads: Callable[[], list[threading.Thread]] = threading.enumerate,
                 read_thread: Callable[[int], float | None] = thread_cpu_seconds):
        self.read_total, self.prefix, self.threads, self.read_thread = read_total, prefix, threads, read_thread
        # each load thread (kept, not its id: the kernel reuses ids) -> its CPU seconds when last read
        self.load_s: dict[threading.Thread, float] = {}

    def __call__(self) -> float:
        for t in self.threads():
            if t.name.startswith(self.prefix) and t.native_id is not None:
                seconds = self.read_thread(t.native_id)
                if seconds is not None:
                    self.load_s[t] = seconds
        return self.read_total() - sum(self.load_s.values())
