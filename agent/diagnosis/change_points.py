"""Configuration changes and restarts of an instance from its metrics alone, over any PromQL engine.

Where no sidecar recorded the configuration (an ingested dump, a fleet's Prometheus) the metrics
still show both:

* a configuration change: an `_info` series (vllm:cache_config_info: what the engine resolved)
  whose labels change: the samples of one label set end and those of another begin. The change is
  the new label set's first sample.
* a restart: the API server's process start time jumps, or vLLM's counters go down (a new process
  counts from zero), often after a gap in the instance's samples while the server was gone. A
  restart is where the samples resume; a gap alone (a scrape outage) is none.

Each series is read at a coarse step over the searched stretch, then again at 1 s around what
that found, so a change is placed within a scrape of where it happened. Sample times come from
`timestamp()` of a plain selector, which both engines answer with the sample's own time: presence
read from the 5-minute lookback would keep an ended label set alive for minutes after its end.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.diagnosis.liveconfig import CACHE_INFO_METRIC
from vllm_sentinel.agent.diagnosis.metrics_config import SERVER_START_SELECTORS
from vllm_sentinel.agent.promql.remote import instant_all, range_all
from vllm_sentinel.collectors.timefmt import iso_seconds

CONFIGURATION = "configuration"
RESTART = "restart"
# labels that say which series a label set belongs to, not what it configures
IDENTITY = frozenset({"__name__", "instance", "job", "engine"})
# labels of info series that follow the load, not the configuration
LOAD_LABELS: dict[str, frozenset[str]] = {
    "vllm:lora_requests_info": frozenset({"running_lora_adapters", "waiting_lora_adapters"}),
}
COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
# what shows the instance is being scraped: a vLLM gauge every version has, and the scrape's own `up`
PRESENCE = ("vllm:num_requests_running", "up")
MIN_STEP_MS = 5_000
MAX_POINTS = 2_000
FINE_STEP_MS = 1_000
MIN_GAP_MS = 30_000
GAP_INTERVALS = 3  # a gap is this many scrape intervals without a sample (and MIN_GAP_MS at least)
# the down time before a restart is looked for this far back: a large model loads for minutes
GAP_SEARCH_MS = 15 * 60_000
# signs closer than this are one restart: a start time, a counter reset and a gap's end seen a scrape apart
MERGE_MS = 30_000

Group = tuple[str, str, str, str]  # (metric, instance, job, engine)
LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ChangePoint:
    """One change of an instance: when, which kind, what showed it, and for a configuration what changed."""

    at_ms: int
    kind: str  # CONFIGURATION or RESTART
    shown_by: str  # "vllm:cache_config_info labels changed", "a gap of 62 s then counters reset", ...
    changes: tuple[dict[str, str | None], ...] = ()  # configuration: {param, before, after}
    gap: tuple[int, int] | None = None  # restart: (last sample before, first sample after) when samples stopped

    def as_dict(self) -> dict[str, Any]:
        """The change as JSON: at, kind, shown_by, and changes or gap where it has them."""
        doc: dict[str, Any] = {"at": iso_seconds(self.at_ms), "kind": self.kind, "shown_by": self.shown_by}
        if self.changes:
            doc["changes"] = [dict(c) for c in self.changes]
        if self.gap is not None:
            doc["gap"] = {"start": iso_seconds(self.gap[0]), "end": iso_seconds(self.gap[1])}
        return doc


def find_changes(engine: Any, instance: str, lo_ms: int, hi_ms: int) -> list[ChangePoint]:
    """Every configuration change and restart of `instance` in (lo_ms, hi_ms], oldest first."""
    found = info_changes(engine, instance, lo_ms, hi_ms) + restart_points(engine, instance, lo_ms, hi_ms)
    return sorted(found, key=lambda p: (p.at_ms, p.kind))


def scan_step(lo_ms: int, hi_ms: int) -> int:
    """The coarse step a stretch is read at: 5 s, or coarser in whole seconds past MAX_POINTS points."""
    return max(MIN_STEP_MS, (hi_ms - lo_ms) // MAX_POINTS // 1000 * 1000)


def _q(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _selector(metric: str, instance: str) -> str:
    """'m{a="b"}' scoped to one instance: 'm{a="b", instance="i"}'."""
    if metric.endswith("}"):
        return f"{metric[:-1]}, instance={_q(instance)}}}"
    return f"{metric}{{instance={_q(instance)}}}"


def _stamps(metric: str, instance: str) -> str:
    """The time of each series' newest sample: timestamp() of the plain selector (the metric's name dropped)."""
    return f"timestamp({{__name__={_q(metric)}, instance={_q(instance)}}})"


# --- info series ------------------------------------------------------------------------------------

def _split(metric: str, labels: dict[str, str]) -> tuple[Group, LabelSet]:
    """(which series, what it says): the identity labels, and the labels that configure."""
    skip = IDENTITY | LOAD_LABELS.get(metric, frozenset())
    group = (metric, labels.get("instance", ""), labels.get("job", ""), labels.get("engine", ""))
    return group, tuple(sorted((k, v) for k, v in labels.items() if k not in skip))


def param_name(metric: str, label: str) -> str:
    """The name a label's value goes by: cache_config_info's by vLLM's own name, others' as 'metric{label}'."""
    return label if metric == CACHE_INFO_METRIC else f"{metric}{{{label}}}"


def _diff(metric: str, old: LabelSet, new: LabelSet) -> tuple[dict[str, str | None], ...]:
    """The labels that differ: ({param, before, after}, ...) by name."""
    before, after = dict(old), dict(new)
    return tuple({"param": param_name(metric, k), "before": before.get(k), "after": after.get(k)}
                 for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k))


def _info_names(engine: Any, instance: str, lo_ms: int, hi_ms: int, step_ms: int) -> list[str]:
    """The names of the instance's `_info` series with a sample in the stretch (or the lookback before it)."""
    [series] = range_all(engine, [(f'{{__name__=~".+_info", instance={_q(instance)}}}', lo_ms, hi_ms, step_ms)])
    return sorted({s.labels["__name__"] for s in series if "__name__" in s.labels})


def _observed(engine: Any, instance: str, names: list[str], lo_ms: int, hi_ms: int,
              step_ms: int) -> dict[Group, list[tuple[int, LabelSet]]]:
    """Per series identity, the (sample time, label set) pairs seen at the steps, by time."""
    results = range_all(engine, [(_stamps(n, instance), lo_ms, hi_ms, step_ms) for n in names])
    seen: dict[Group, set[tuple[int, LabelSet]]] = {}
    for name, series in zip(names, results):
        for s in series:
            group, labels = _split(name, s.labels)
            seen.setdefault(group, set()).update((round(v * 1000), labels) for _t, v in s.points)
    return {g: sorted(obs) for g, obs in seen.items()}


def _first_sample(engine: Any, expr: str, lo_ms: int, hi_ms: int, want: Callable[[dict], bool]) -> int | None:
    """The first sample time after lo_ms that `expr` (timestamp() of a selector) shows in series `want`
    accepts, read at 1 s over (lo_ms, hi_ms]."""
    [series] = range_all(engine, [(expr, lo_ms, hi_ms, FINE_STEP_MS)])
    times = [round(v * 1000) for s in series if want(s.labels) for _t, v in s.points]
    return min((t for t in times if t > lo_ms), default=None)


def info_changes(engine: Any, instance: str, lo_ms: int, hi_ms: int) -> list[ChangePoint]:
    """Each time in (lo_ms, hi_ms] an `_info` series of `instance` took other labels, with the differences."""
    step = scan_step(lo_ms, hi_ms)
    names = _info_names(engine, instance, lo_ms, hi_ms, step)
    if not names:
        return []
    by_time: dict[int, list[ChangePoint]] = {}
    for group, obs in sorted(_observed(engine, instance, names, lo_ms, hi_ms, step).items()):
        for (prev_ts, old), (ts, new) in zip(obs, obs[1:]):
            if new == old or ts <= lo_ms:
                continue

            def want(labels: dict, g: Group = group, n: LabelSet = new) -> bool:
                return _split(g[0], labels) == (g, n)

            at = _first_sample(engine, _stamps(group[0], instance), max(prev_ts, ts - step), ts, want) or ts
            if lo_ms < at <= hi_ms:
                by_time.setdefault(at, []).append(
                    ChangePoint(at, CONFIGURATION, f"{group[0]} labels changed", _diff(group[0], old, new)))
    return [_merged(points) for _t, points in sorted(by_time.items())]


def _merged(points: list[ChangePoint]) -> ChangePoint:
    """Changes at one time (each engine's series, several info series) as one, each difference once."""
    changes: list[dict[str, str | None]] = []
    for p in points:
        changes += [c for c in p.changes if c not in changes]
    shown = ", ".join(dict.fromkeys(p.shown_by for p in points))
    return ChangePoint(points[0].at_ms, CONFIGURATION, shown, tuple(changes))


def info_config_at(engine: Any, instance: str, t_ms: int) -> dict[str, str]:
    """The labels of the instance's `_info` series in force at t_ms, by param_name (the lowest engine's first)."""
    [now] = instant_all(engine, [(f'{{__name__=~".+_info", instance={_q(instance)}}}', t_ms)])
    sets: dict[Group, list[LabelSet]] = {}
    for s in now if isinstance(now, list) else []:
        group, labels = _split(s.labels.get("__name__", ""), s.labels)
        sets.setdefault(group, []).append(labels)
    # right after a change the lookback still holds the old label set: the newest sample decides
    unsure = sorted({g[0] for g, found in sets.items() if len(found) > 1})
    for name, result in zip(unsure, instant_all(engine, [(_stamps(n, instance), t_ms) for n in unsure])):
        newest: dict[Group, tuple[float, LabelSet]] = {}
        for s in result if isinstance(result, list) else []:
            group, labels = _split(name, s.labels)
            if group not in newest or s.value > newest[group][0]:
                newest[group] = (s.value, labels)
        sets.update({g: [labels] for g, (_v, labels) in newest.items()})
    out: dict[str, str] = {}
    for group, found in sorted(sets.items()):
        for label, value in found[0]:
            out.setdefault(param_name(group[0], label), value)
    return out


# --- restarts ---------------------------------------------------------------------------------------

def _first_step(engine: Any, expr: str, labels: dict[str, str], lo_ms: int, hi_ms: int,
                test: Callable[[float], bool]) -> int | None:
    """The first 1 s step in [lo_ms, hi_ms] where the series of `expr` with `labels` passes `test`."""
    [series] = range_all(engine, [(expr, lo_ms, hi_ms, FINE_STEP_MS)])
    return next((t for s in series if dict(s.labels) == labels for t, v in s.points if test(v)), None)


def _counter_resets(engine: Any, instance: str, lo_ms: int, hi_ms: int, step_ms: int) -> list[int]:
    """Times in the stretch where a vLLM counter went down (its first lower sample, to the second)."""
    exprs = [_selector(c, instance) for c in COUNTERS]
    found: list[tuple[int, str, dict[str, str], float]] = []  # (step, expr, series, value before)
    for expr, series in zip(exprs, range_all(engine, [(e, lo_ms, hi_ms, step_ms) for e in exprs])):
        for s in series:
            found += [(t1, expr, dict(s.labels), v0) for (_t0, v0), (t1, v1) in zip(s.points, s.points[1:]) if v1 < v0]
    out: list[int] = []
    last_step = None
    for t, expr, labels, before in sorted(found, key=lambda f: f[0]):
        if last_step is not None and t - last_step <= MERGE_MS:
            continue  # every counter resets with its process: one restart
        last_step = t
        out.append(_first_step(engine, expr, labels, t - step_ms, t, lambda v, b=before: v < b) or t)
    return out


def _start_jumps(engine: Any, instance: str, lo_ms: int, hi_ms: int, step_ms: int) -> list[tuple[int, str]]:
    """(first sample showing the new start, metric) for each jump of the API server's process start time."""
    exprs = [f"max by (instance) ({_selector(sel, instance)})" for sel in SERVER_START_SELECTORS]
    out = []
    for sel, expr, series in zip(SERVER_START_SELECTORS, exprs,
                                 range_all(engine, [(e, lo_ms, hi_ms, step_ms) for e in exprs])):
        for s in series:
            for (_t0, v0), (t1, v1) in zip(s.points, s.points[1:]):
                if v1 > v0 + 1:  # whole seconds: jitter is no restart
                    at = _first_step(engine, expr, dict(s.labels), t1 - step_ms, t1, lambda v, b=v0: v > b + 1)
                    out.append((at or t1, sel.split("{")[0]))
    return sorted(out)


def gap_in(times: list[int], near_ms: int) -> tuple[int, int] | None:
    """The stretch without samples (last before, first after) that holds or ends next to near_ms, if any:
    longer than GAP_INTERVALS of the usual interval between `times` and MIN_GAP_MS at least."""
    if len(times) < 2:
        return None
    pairs = list(zip(times, times[1:]))
    threshold = max(MIN_GAP_MS, GAP_INTERVALS * statistics.median(b - a for a, b in pairs))
    gaps = [(a, b) for a, b in pairs if b - a > threshold and a - MERGE_MS <= near_ms <= b + MERGE_MS]
    return min(gaps, key=lambda g: abs(g[1] - near_ms)) if gaps else None


def _gap_before(engine: Any, instance: str, at_ms: int) -> tuple[int, int] | None:
    """The gap in the instance's samples a restart at at_ms ended: its vLLM samples' first, else `up`'s."""
    exprs = [f"max by (instance) (timestamp({_selector(m, instance)}))" for m in PRESENCE]
    for series in range_all(engine, [(e, at_ms - GAP_SEARCH_MS, at_ms + MERGE_MS, FINE_STEP_MS) for e in exprs]):
        gap = gap_in(sorted({round(v * 1000) for s in series for _t, v in s.points}), at_ms)
        if gap is not None:
            return gap
    return None


@dataclass
class _Restart:
    """What showed one restart: a counter reset, a start time jump, a gap in the samples before it."""

    reset_ms: int | None = None
    jumped: str | None = None  # the start time metric that jumped
    gap: tuple[int, int] | None = None
    anchor_ms: int = 0  # the first sign seen: the reset, else the jump

    def covers(self, t_ms: int) -> bool:
        """t_ms is this restart's: inside its gap, or within MERGE_MS of it."""
        lo, hi = self.gap if self.gap else (self.anchor_ms, self.anchor_ms)
        return lo - MERGE_MS <= t_ms <= hi + MERGE_MS

    def point(self) -> ChangePoint:
        """The restart where the samples resume, and what showed it in words."""
        parts = [f"{self.jumped} jumped"] if self.jumped else []
        gap = f"a gap of {round((self.gap[1] - self.gap[0]) / 1000)} s" if self.gap else None
        if self.reset_ms is not None:
            parts.append(f"{gap} then counters reset" if gap else "counters reset")
        elif gap:
            parts[-1] += f" after {gap}"
        return ChangePoint(self.gap[1] if self.gap else self.anchor_ms, RESTART, ", ".join(parts), gap=self.gap)


def restart_points(engine: Any, instance: str, lo_ms: int, hi_ms: int) -> list[ChangePoint]:
    """The restarts of `instance` in (lo_ms, hi_ms], oldest first: counter resets, start time jumps, and the
    gap in its samples each one ended."""
    step = scan_step(lo_ms, hi_ms)
    found = [_Restart(reset_ms=r, gap=_gap_before(engine, instance, r), anchor_ms=r)
             for r in _counter_resets(engine, instance, lo_ms, hi_ms, step)]
    for at, metric in _start_jumps(engine, instance, lo_ms, hi_ms, step):
        same = next((r for r in found if r.covers(at)), None)
        if same is None:
            found.append(_Restart(jumped=metric, gap=_gap_before(engine, instance, at), anchor_ms=at))
        elif same.jumped is None:
            same.jumped = metric
    points = sorted((r.point() for r in found), key=lambda p: p.at_ms)
    return [p for p in points if lo_ms < p.at_ms <= hi_ms]
