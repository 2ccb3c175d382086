"""Which rule files the daemon and `diagnose` evaluate: the shipped pack, or the operator's own."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel import rules as _rules_pkg
from vllm_sentinel.agent.alerts.rulefile import (ParamOverrides, ParamValues, RuleFile, load_params_file,
                                          load_rule_files)


def packaged_rules_dir() -> Path:
    """The folder of the rule files shipped with vllm-sentinel (rules/*.yaml)."""
    return Path(_rules_pkg.__file__).parent


def load_pack(paths: list[Path] | None = None,
              params: str | Path | ParamOverrides | ParamValues | None = None) -> list[RuleFile]:
    """Rule files from `paths` (files or folders), else the shipped pack; RuleFileError names file:line.

    `params` overrides the files' threshold parameters: a YAML file (`--params FILE`, mapping
    `name: value`) or a mapping; an unknown name is a RuleFileError listing the declared ones.
    """
    if isinstance(params, (str, Path)):
        params = load_params_file(params)
    return load_rule_files(list(paths) if paths else [packaged_rules_dir()], params)


LOOKBACK_MS = 300_000
MAX_STEPS = 2_000  # per rule and window: 5 s steps up to ~2.8 h, coarser beyond (live incidents stay exact)


def pack_window_evaluator(pack: list[RuleFile]):
    """diagnose's evaluator: the window replay, fixes computed from the configuration in force at its end."""
    from vllm_sentinel.agent.diagnosis import liveconfig
    from vllm_sentinel.agent.diagnosis.incidents import DEFAULT_STEP_MS, evaluate_window

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
