"""What was written since a mark: lets a live reader re-read only the samples that changed.

The daemon evaluates its rules every few seconds over windows of minutes; re-reading only the
samples written since its last read (plus any late ones) instead of whole windows is what keeps
that cheap. Every write notes the oldest sample time it wrote; dropping or rewriting partitions
notes EVERYTHING, after which a reader starts over.
"""

from __future__ import annotations

import threading
from collections import deque

EVERYTHING = -(2**63)  # "anything may have changed": read it all again
KEEP = 4096  # marks older than this many writes ago answer EVERYTHING


class WriteLog:
    """A bounded log of (write number, oldest sample time written); thread-safe."""

    def __init__(self, keep: int = KEEP) -> None:
        self._seq = 0
        self._log: deque[tuple[int, int]] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def note(self, oldest_ts_ms: int) -> None:
        """One write whose oldest sample is at oldest_ts_ms (EVERYTHING: rows were dropped or rewritten)."""
        with self._lock:
            self._seq += 1
            self._log.append((self._seq, oldest_ts_ms))

    def mark(self) -> int:
        """The current position; take it before reading, so writes during the read count as after it."""
        return self._seq

    def oldest_since(self, mark: int) -> int | None:
        """The oldest sample time written after `mark`: None when nothing was, EVERYTHING when unknown.

        Example: note(5000); m = mark(); note(7000); note(6000) -> oldest_since(m) == 6000.
        """
        with self._lock:
            if mark >= self._seq:
                return None
            if not self._log or self._log[0][0] > mark + 1:
                return EVERYTHING  # the log no longer reaches back to that mark
            oldest = None
            for seq, ts in reversed(self._log):  # newest first: only the writes since the mark are read
                if seq <= mark:
                    break
                oldest = ts if oldest is None else min(oldest, ts)
            return oldest
