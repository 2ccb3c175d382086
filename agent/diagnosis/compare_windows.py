"""Which stretches of history `compare` sets side by side: given ones, or around the latest change.

`--change auto` takes the latest event of an instance in the searched stretch: a configuration
change (a sidecar snapshot that differs from the one before it, or where no sidecar watched, an
`_info` series whose labels changed: agent/diagnosis/change_points.py), or a restart, from the
metrics whatever the source: the API server's process start time jumps, or vLLM's counters reset.
The server is down around a restart: `up` reads 0 from the old process' exit until the new one
answers, or (an ingested dump, a sidecar that stopped too) no sample arrives at all. The
before-window ends where that down time starts, the after-window starts where it ends plus a
settling margin (caches fill, queues reach their steady state), and both are as long as the
shorter side allows (capped by `--window`), never reaching past an earlier change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.diagnosis.change_points import restart_points
from vllm_sentinel.agent.promql.remote import range_all
from vllm_sentinel.collectors.timefmt import iso_seconds

GAP_SEARCH_MS = 15 * 60_000  # a restart's down time is looked for this far either side of the change
GAP_STEP_MS = 5_000
GAP_LOOK_S = 15  # each step reads `up` this far back: a Prometheus scrapes every 15 s by default
MIN_INTERVALS_A_SIDE = 4


class NoChangeFound(Exception):
    """No configuration change or restart in the searched stretch, or too little data either side."""


@dataclass(frozen=True)
class ChangeWindows:
    """The two windows compared, and what lies between them."""

    before: tuple[int, int]
    after: tuple[int, int]
    change_ms: int | None = None  # the change event (None: windows given)
    kind: str = "given"  # "configuration change", "restart", "given", "same window"
    down: tuple[int, int] | None = None  # the server's down time around the change

    def as_dict(self) -> dict:
        """The contract's `window` object, plus the change and the skipped stretch between the windows."""
        doc: dict[str, Any] = {"before": {"start": iso_seconds(self.before[0]), "end": iso_seconds(self.before[1])},
                               "after": {"start": iso_seconds(self.after[0]), "end": iso_seconds(self.after[1])}}
        if self.change_ms is not None:
            doc["change"] = {"at": iso_seconds(self.change_ms), "kind": self.kind}
        if self.down is not None:
            doc["down"] = {"start": iso_seconds(self.down[0]), "end": iso_seconds(self.down[1])}
        return doc


def down_around(engine: Any, instance: str, restart_ms: int, lo_ms: int, hi_ms: int) -> tuple[int, int] | None:
    """(first down, back up) of the `up == 0` stretch holding a restart (the new process' first sign); None if none."""
    lo, hi = max(lo_ms, restart_ms - GAP_SEARCH_MS), min(hi_ms, restart_ms + GAP_SEARCH_MS)
    if hi - lo < GAP_STEP_MS:
        return None
    [result] = range_all(engine, [(f"min by (instance) (min_over_time(up[{GAP_LOOK_S}s]))", lo, hi, GAP_STEP_MS)])
    points = next((s.points for s in result if s.labels.get("instance") == instance), [])
    runs: list[list[int]] = []  # [first down, last down, first up after]
    for t, v in points:
        if v == 0:
            if runs and runs[-1][2] == 0:
                runs[-1][1] = t
            else:
                runs.append([t, t, 0])
        elif runs and runs[-1][2] == 0:
            runs[-1][2] = t
    # the new process starts while the old one is gone and before it answers; a failed scrape elsewhere
    # (a busy host) is no restart
    around = [r for r in runs if r[2] and r[0] - GAP_LOOK_S * 1000 <= restart_ms <= r[2]]
    if not around:
        return None
    first, _, up_again = around[-1]
    return first - GAP_LOOK_S * 1000, up_again


def auto_windows(engine: Any, instance: str, stretch: tuple[int, int], settle_ms: int, window_ms: int | None,
                 interval_ms: int, config_changes: Callable[[str, int, int], list[int]]) -> ChangeWindows:
    """The windows either side of the latest change of `instance` in `stretch`; NoChangeFound when none."""
    lo, hi = stretch
    configs = config_changes(instance, lo, hi)
    found = restart_points(engine, instance, lo, hi)
    events = sorted(set(configs) | {p.at_ms for p in found})
    if not events:
        raise NoChangeFound(f"no configuration change or restart of {instance} between {iso_seconds(lo)} and "
                            f"{iso_seconds(hi)}; widen --since/--until, or give --before/--after windows")
    change = events[-1]
    # the sidecar records a new command line once it finds the new server listening (startup takes a
    # minute or more) and at its next snapshot: the restart behind a change is the last one before it,
    # and the new settings were in force from the moment that server answered
    restart = next((p for p in reversed(found) if change - GAP_SEARCH_MS <= p.at_ms <= change), None)
    # where no `up` reads 0 (a dump holds the samples scraped, none for the down time), the gap in them
    down = (down_around(engine, instance, restart.at_ms, lo, hi) or restart.gap) if restart is not None else None
    before_end, ready = down if down else (change, change)
    after_start = ready + settle_ms
    earlier = [e for e in events if e < before_end]
    floor = max(lo, earlier[-1] + settle_ms) if earlier else lo
    length = min(before_end - floor, hi - after_start)
    if window_ms is not None:
        length = min(length, window_ms)
    if length < MIN_INTERVALS_A_SIDE * interval_ms:
        raise NoChangeFound(
            f"the change of {instance} at "
            f"{iso_seconds(change)} leaves {max(0, length) // 1000} s either side (after a {settle_ms // 1000} s "
            f"settling margin); compare needs {MIN_INTERVALS_A_SIDE * interval_ms // 1000} s: wait for more data "
            "after it, lower --settle, or give --before/--after")
    kind = "configuration change" if any(before_end <= c <= change for c in configs) else "restart"
    return ChangeWindows((before_end - length, before_end), (after_start, after_start + length), change, kind, down)
