"""Which rule files the daemon and `diagnose` evaluate: the shipped pack, or the operator's own."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel import rules as _rules_pkg
from vllm_sentinel.agent.alerts.rulefile import load_rule_files
from vllm_sentinel.agent.alerts.rulemodel import RuleFile
from vllm_sentinel.agent.alerts.ruleparams import ParamOverrides, ParamValues, load_params_file


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

