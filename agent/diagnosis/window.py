"""diagnose's window evaluator for a rule pack: bounded replay of the rules over a stretch of history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.alerts.explains import CausalLinks, causal_links
from vllm_sentinel.agent.alerts.rulemodel import RuleFile, RuleGroup, fingerprint
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.episodes import DEFAULT_TOLERANCE_MS, link_episodes
from vllm_sentinel.agent.diagnosis.incidents import DEFAULT_STEP_MS, ConfigFor, evaluate_window
from vllm_sentinel.agent.diagnosis.metrics_config import metrics_configs
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store import coverage_table
from vllm_sentinel.collectors.timefmt import iso_seconds

LOOKBACK_MS = 300_000
MAX_STEPS = 2_000  # per rule and window: 5 s steps up to ~2.8 h, coarser beyond (live incidents stay exact)


def window_step(lo_ms: int, hi_ms: int) -> int:
    """The evaluation step over [lo_ms, hi_ms]: the rules' 5 s, coarser (in 5 s units) past MAX_STEPS steps."""
    return max(DEFAULT_STEP_MS, -(-(hi_ms - lo_ms) // MAX_STEPS) // DEFAULT_STEP_MS * DEFAULT_STEP_MS)


def data_bounds(start_ms: int, end_ms: int, first_ms: int, last_ms: int) -> tuple[int, int]:
    """The part of the window where anything can fire: the data's span plus the 5-minute lookback."""
    return max(start_ms, first_ms - LOOKBACK_MS), min(end_ms, last_ms + LOOKBACK_MS)


def store_config_for(store: Any, start_ms: int, end_ms: int, step_ms: int) -> ConfigFor:
    """instance -> the configuration snapshot in force at `end_ms`; with none (an ingested dump), the
    configuration the metrics show (agent/diagnosis/metrics_config.py), each inferred value said so."""
    snapshots = liveconfig.config_for(store, end_ms)
    inferred: dict[str, Any] = {}

    def lookup(instance: str | None) -> Any:
        snap = snapshots(instance)
        if snap or instance is None:
            return snap
        if instance not in inferred:
            inferred.update(metrics_configs(Engine(store), [instance], end_ms, step_ms, start_ms))
        return inferred.get(instance) or {}
    return lookup


@dataclass
class EvaluationPlan:
    """Where a window's incidents come from: stretches the daemon evaluated live (read from the incidents
    table), and the rest, replayed at `step_ms`."""

    live: list[tuple[int, int]]
    replayed: list[tuple[int, int]]
    step_ms: int

    def as_dict(self) -> dict:
        """The `evaluation` block of the diagnose JSON."""
        return {"step_s": self.step_ms / 1000,
                "live": [{"start": iso_seconds(a), "end": iso_seconds(b)} for a, b in self.live],
                "replayed": [{"start": iso_seconds(a), "end": iso_seconds(b)} for a, b in self.replayed]}


class PackWindowEvaluator:
    """diagnose's evaluator for a pack: the window replay, fixes computed from the configuration in
    force at its end; `links` are the pack's causal links, for grouping what it finds in episodes.

    With `reuse_live`, where the daemon evaluated this same pack live (rule_coverage) its incidents are
    taken from the incidents table and only the rest of the window is replayed, so the cost follows what
    no daemon watched. Off by default: on a starved host the live evaluation (late scrapes, evaluations
    far apart) can miss an incident a replay of the stored samples finds.
    """

    def __init__(self, pack: list[RuleFile], reuse_live: bool = False):
        self.pack = pack
        self.reuse_live = reuse_live
        self.links: CausalLinks = causal_links(pack)
        self.fingerprint = fingerprint([g for f in pack for g in f.groups])

    def reusing_live(self) -> "PackWindowEvaluator":
        """The same evaluator with reuse_live on."""
        return PackWindowEvaluator(self.pack, reuse_live=True)

    def plan(self, store: Any, start_ms: int, end_ms: int) -> EvaluationPlan:
        """The live and replayed stretches of (start_ms, end_ms]."""
        span = store.time_range()
        if span is None:
            return EvaluationPlan([], [], DEFAULT_STEP_MS)
        # nothing fires where there is no data (5 min lookback aside): a `--since 30d` over an hour of
        # history costs an hour, and very long windows take coarser steps (bounded work)
        lo, hi = data_bounds(start_ms, end_ms, span[0], span[1])
        if lo >= hi:
            return EvaluationPlan([], [], DEFAULT_STEP_MS)
        live = coverage_table.covered(store, self.fingerprint, lo, hi) if self.reuse_live else []
        replayed = coverage_table.gaps(live, lo, hi)
        step = window_step(0, sum(b - a for a, b in replayed))
        return EvaluationPlan(live, replayed, step)

    def __call__(self, store: Any, start_ms: int, end_ms: int, instance: str | None) -> list[dict]:
        """Incidents of the pack in (start_ms, end_ms], in the diagnose JSON contract."""
        plan = self.plan(store, start_ms, end_ms)
        found: list[dict] = []
        for lo, hi in plan.replayed:
            found.extend(evaluate_window(store, lo, hi, instance, self.pack, step_ms=plan.step_ms,
                                         config_for=store_config_for(store, lo, end_ms, plan.step_ms)))
        found.sort(key=lambda d: (d["start"], d["rule"], d["id"]))
        return found


def pack_window_evaluator(pack: list[RuleFile], reuse_live: bool = False) -> PackWindowEvaluator:
    """diagnose's evaluator for `pack` (a callable carrying the pack's causal links)."""
    return PackWindowEvaluator(pack, reuse_live)


def evaluate_episodes(store: Any, groups: list[RuleGroup], end_ms: int, step_ms: int,
                      tolerance_ms: int | None = None) -> list[dict]:
    """A rule test's episode_test runner: the incidents of `groups` over (0, end_ms] of `store`, linked
    in episodes as `diagnose` links them (RuleFileError when the groups' links have a cycle)."""
    found = evaluate_window(store, 0, end_ms, None, groups, step_ms=step_ms)
    return link_episodes(found, causal_links(groups), DEFAULT_TOLERANCE_MS if tolerance_ms is None else tolerance_ms)
