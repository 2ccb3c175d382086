"""Rule-file parameters: `params:` defaults, `${name}` substitution and override files (`--params FILE`).

Thresholds an operator may change are parameters: a top-level `params:` mapping declares each
with its default, and `${name}` anywhere in the file (expr, for, annotations, evidence, fix)
is replaced by its value before the file is parsed. An override file (`--params FILE`, a flat
mapping `name: value`) changes them; a name no loaded file declares is an error that lists the
declared names. Example: `params: {ttft_slo_seconds: 2}` with
`expr: histogram_quantile(0.95, ...) > ${ttft_slo_seconds}` reads `... > 2`, or `... > 1.5`
with an override `ttft_slo_seconds: 1.5`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.ruleschema import SchemaLoader

_PARAM_REF_RE = re.compile(r"\$\{([^}]*)\}")
_PARAM_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# a parameter value is pasted into YAML and PromQL text: numbers, durations and plain words only
_PARAM_VALUE_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
# a parameter value is pasted into YAML and PromQL text: numbers, durations and plain words only


ParamValues = Mapping[str, Any]


@dataclass
class ParamOverrides:
    """Parameter values that replace the rule files' defaults, and where they came from (for messages)."""

    values: dict[str, Any]
    source: str = "parameter overrides"


def param_text(value: Any, where: str = "") -> str:
    """A parameter value as pasted into rule text: 2 -> '2', 0.1 -> '0.1', '1m' -> '1m'; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{where}must be a number or a duration, not {str(value).lower()}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where}must be a finite number")
        return repr(value)
    if isinstance(value, str) and _PARAM_VALUE_RE.match(value):
        return value
    raise ValueError(f"{where}{value!r} is not a number, a duration (1m30s) or a plain word")


def read_params(root: Node | None, path: str, problems: list[str]) -> dict[str, str]:
    """The `params:` mapping of a composed rule file: name -> default as text."""
    if not isinstance(root, MappingNode):
        return {}
    node = next((v for k, v in root.value if isinstance(k, ScalarNode) and k.value == "params"), None)
    if node is None or (isinstance(node, ScalarNode) and node.tag.endswith(":null")):
        return {}
    loader = SchemaLoader(path)
    if not isinstance(node, MappingNode):
        loader.err(node, "params must be a mapping of parameter names to default values")
        problems.extend(loader.problems)
        return {}
    out: dict[str, str] = {}
    for k, v in node.value:
        name = k.value if isinstance(k, ScalarNode) else ""
        if not _PARAM_NAME_RE.match(name):
            loader.err(k, f"invalid parameter name {name!r} (letters, digits and _)")
            continue
        if name in out:
            loader.err(k, f"parameter {name!r} repeated in params")
            continue
        value = loader.scalar(v, f"parameter {name!r}")
        try:
            out[name] = param_text(value, f"parameter {name!r} ")
        except ValueError as e:
            loader.err(v, str(e))
    problems.extend(loader.problems)
    return out


def substitute_params(text: str, values: ParamValues, path: str) -> tuple[str, list[str]]:
    """Replace `${name}` by its value on every non-comment line; unknown names are problems with file:line:col.

    >>> substitute_params("expr: x > ${slo}", {"slo": "2"}, "f")[0]
    'expr: x > 2'
    """
    problems: list[str] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if "${" not in line or line.lstrip().startswith("#"):
            continue

        def repl(m: re.Match, i: int = i) -> str:
            name = m.group(1)
            if name in values:
                return str(values[name])
            problems.append(f"{path}:{i + 1}:{m.start() + 1}: unknown parameter ${{{name}}}; declared in params: "
                            f"{', '.join(sorted(values)) or 'none (add a top-level params: mapping)'}")
            return m.group(0)
        lines[i] = _PARAM_REF_RE.sub(repl, line)
    return "\n".join(lines), problems


def load_params_file(path: str | Path) -> ParamOverrides:
    """A parameter override file: a YAML mapping `name: value` (or the same under a `params:` key)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as e:  # a binary file is as unreadable as a missing one
        raise RuleFileError([f"{p}: cannot read parameter file: {getattr(e, 'strerror', None) or e}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        raise RuleFileError([f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}"]) from None
    if isinstance(data, dict) and set(data) == {"params"}:
        data = data["params"]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RuleFileError([f"{p}: a parameter file is a mapping `name: value`, e.g. `ttft_slo_seconds: 1.5`"])
    problems = []
    for name, value in data.items():
        try:
            param_text(value, f"parameter {name!r} ")
        except ValueError as e:
            problems.append(f"{p}: {e}")
    if problems:
        raise RuleFileError(problems)
    return ParamOverrides({str(k): v for k, v in data.items()}, str(p))
