"""Rule files: Prometheus rule groups plus vllm-sentinel's keys, loaded with a strict schema.

A file reads like any Prometheus rule file; an alerting rule may also carry `description`,
`references`, `evidence` (named PromQL signals) and `fix` (parameter suggestions). Every problem
is reported with `file:line:col` (agent/alerts/ruleschema.py); `${name}` parameters are
substituted first (agent/alerts/ruleparams.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from yaml.nodes import Node

from vllm_sentinel.agent.alerts.explains import causal_links
from vllm_sentinel.agent.alerts.rulemodel import RuleFile, RuleFileError
from vllm_sentinel.agent.alerts.ruleparams import (ParamOverrides, ParamValues, param_text, read_params,
                                                   substitute_params)
from vllm_sentinel.agent.alerts.ruleschema import SchemaLoader


# libyaml's parser where PyYAML was built with it: the packaged pack composes in 0.05 s instead of 0.5 s
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _compose(text: str, path: str) -> Node | None:
    try:
        return yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        raise RuleFileError([f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}"]) from None


def parse_rule_text(text: str, path: str = "<string>", params: ParamValues | None = None) -> RuleFile:
    """Parse rule-file text; `params` overrides declared parameters (others are ignored here).

    RuleFileError lists every problem with file:line:col.
    """
    problems: list[str] = []
    root = _compose(text, path)
    values = read_params(root, path, problems)
    for name, value in (params or {}).items():
        if name in values:
            try:
                values[name] = param_text(value, f"parameter {name!r} ")
            except ValueError as e:
                problems.append(f"{path}: override of {e}")
    if problems:
        raise RuleFileError(problems)
    if "${" in text:
        text, problems = substitute_params(text, values, path)
        if problems:
            raise RuleFileError(problems)
        root = _compose(text, path)
    loader = SchemaLoader(path)
    groups = loader.file(root)
    if loader.problems:
        raise RuleFileError(loader.problems)
    return RuleFile(path, groups, values)


def load_rule_file(path: str | Path, params: ParamValues | None = None) -> RuleFile:
    """Load and validate one rule file, with parameter overrides applied where it declares them."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:  # a binary file is as unreadable as a missing one
        raise RuleFileError([f"{p}: cannot read rule file: {getattr(e, 'strerror', None) or e}"]) from None
    return parse_rule_text(text, str(p), params)


def load_rule_files(paths: list[str | Path], params: ParamOverrides | ParamValues | None = None) -> list[RuleFile]:
    """Load several rule files (directories contribute their *.yaml / *.yml), collecting all problems.

    `params` overrides parameters the files declare; a name none of them declares is an error
    naming the override's source and the declared names. The files' `explains` links together
    must have no cycle (agent/alerts/explains.py).
    """
    overrides = params if isinstance(params, ParamOverrides) else ParamOverrides(dict(params or {}))
    files: list[RuleFile] = []
    problems: list[str] = []
    for path in expand_rule_paths(paths):
        try:
            files.append(load_rule_file(path, overrides.values))
        except RuleFileError as e:
            problems.extend(e.problems)
    if problems:
        raise RuleFileError(problems)
    declared = {name for f in files for name in f.params}
    unknown = sorted(set(overrides.values) - declared)
    if unknown:
        raise RuleFileError([f"{overrides.source}: unknown parameter(s) {', '.join(unknown)}; the rule files declare: "
                             f"{', '.join(sorted(declared)) or 'none'}"])
    causal_links(files)  # a cycle across files is only visible here
    return files


def expand_rule_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given; a directory stands for its *.yaml and *.yml files (not its tests/)."""
    out: list[Path] = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml") and q.is_file()))
        else:
            out.append(p)
    return out


def rule_test_path(rule_path: Path) -> Path:
    """Where a rule file's tests live: rules/x.yaml -> rules/tests/x.test.yaml."""
    return rule_path.parent / "tests" / f"{rule_path.stem}.test.yaml"
