"""The demo's progress lines: each message with the time since the start and an estimate of the time left."""

from __future__ import annotations

import time
from collections.abc import Callable

Say = Callable[[str], None]


def clock_text(seconds: float) -> str:
    """125.4 -> '2:05'."""
    s = max(0, int(round(seconds)))
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    """A plan of named stages with their expected seconds; says each message as '[2:05 in, ~6:40 left] ...'.

    The time left is what remains of the current stage's estimate plus the estimates of the stages not yet
    begun; a stage that overruns its estimate counts as nearly done, so the figure never goes negative.
    """

    def __init__(self, say: Say, stages: list[tuple[str, float]], clock: Callable[[], float] = time.monotonic):
        self._say, self._stages, self._clock = say, list(stages), clock
        self._started = clock()
        self._current = 0
        self._stage_started = self._started

    def begin(self, stage: str) -> None:
        """Mark `stage` (a name of the plan) as started now; later stages keep their estimates."""
        names = [n for n, _ in self._stages]
        if stage not in names:
            raise KeyError(f"no stage {stage!r} in the plan {names}")
        self._current, self._stage_started = names.index(stage), self._clock()

    def left_s(self) -> float:
        """Seconds the plan expects to remain."""
        in_stage = self._clock() - self._stage_started
        now = max(self._stages[self._current][1] - in_stage, 0.0)
        return now + sum(s for _, s in self._stages[self._current + 1:])

    def __call__(self, message: str) -> None:
        elapsed = self._clock() - self._started
        self._say(f"[{clock_text(elapsed)} in, ~{clock_text(self.left_s())} left] {message}")
