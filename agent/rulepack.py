"""Which rule files the daemon and `diagnose` evaluate: the shipped pack, or the operator's own."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel import rules as _rules_pkg
from vllm_sentinel.agent.rulefile import RuleFile, load_rule_files


def packaged_rules_dir() -> Path:
    """The folder of the rule files shipped with vllm-sentinel (rules/*.yaml)."""
    return Path(_rules_pkg.__file__).parent


def load_pack(paths: list[Path] | None = None) -> list[RuleFile]:
    """Rule files from `paths` (files or folders), else the shipped pack; RuleFileError names file:line."""
    return load_rule_files(list(paths) if paths else [packaged_rules_dir()])
