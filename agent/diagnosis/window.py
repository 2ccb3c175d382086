"""diagnose's window evaluator for a rule pack: bounded replay of the rules over a stretch of history."""

from __future__ import annotations

from vllm_sentinel.agent.alerts.rulemodel import RuleFile
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.incidents import DEFAULT_STEP_MS, evaluate_window

LOOKBACK_MS = 300_000
MAX_STEPS = 2_000  # per rule and window: 5 s steps up to ~2.8 h, coarser beyond (live incidents stay exact)


def pack_window_evaluator(pack: list[RuleFile]):
    """diagnose's evaluator: the window replay, fixes computed from the configuration in force at its end."""
    def evaluate(store, start_ms: int, end_ms: int, instance: str | None) -> list[dict]:
        span = store.time_range()
        if span is None:
            return []
        # nothing fires where there is no data (5 min lookback aside): a `--since 30d` over an hour of
        # history costs an hour, and very long windows take coarser steps (bounded work)
        lo, hi = max(start_ms, span[0] - LOOKBACK_MS), min(end_ms, span[1] + LOOKBACK_MS)
        if lo >= hi:
            return []
        step = max(DEFAULT_STEP_MS, -(-(hi - lo) // MAX_STEPS) // DEFAULT_STEP_MS * DEFAULT_STEP_MS)
        return evaluate_window(store, lo, hi, instance, pack, step_ms=step,
                               config_for=liveconfig.config_for(store, end_ms))
    return evaluate
