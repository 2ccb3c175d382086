"""`run --config FILE`: one YAML file holding any option of `run`, named as on the command line.

    # sentinel.yaml
    targets-file: targets.yaml        # relative paths are relative to this file, as in Prometheus
    interval: 1s
    alertmanager: [http://alertmanager:9093]

Keys are the long option names (`scrape-timeout`; `scrape_timeout` is read the same); a
repeatable option takes a list or one value. The options accepted, and their types, are those
of the `run` function's signature, so the file cannot drift from the command line. Options given
on the command line win over the file. Every problem is one line: FILE:LINE, the problem, the fix.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import typer
import yaml

KINDS = {str: "str", int: "int", bool: "bool", Path: "path"}


class RunConfigError(ValueError):
    """A config file that cannot be used; one line naming FILE:LINE and the fix."""


@dataclass(frozen=True)
class FromFile:
    """A value read from the config file, and where."""

    value: Any
    where: str  # FILE:LINE: key


def option_kinds(command: Callable) -> dict[str, str]:
    """The kind of each option of a command from its signature: str, int, bool, path, or list/paths."""
    kinds: dict[str, str] = {}
    for name, hint in typing.get_type_hints(command).items():
        if name == "return" or hint is typer.Context:
            continue
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint
        if typing.get_origin(base) is list:
            kinds[name] = "paths" if typing.get_args(base) == (Path,) else "list"
        elif base in KINDS:
            kinds[name] = KINDS[base]
    return kinds


def typed_params(params: dict[str, Any], kinds: dict[str, str]) -> dict[str, Any]:
    """The command line's values with paths as Path: click hands them to ctx.params as str in some
    typer releases (0.27), as Path in others (0.29)."""
    out = dict(params)
    for name, value in params.items():
        if value is None:
            continue
        if kinds.get(name) == "path":
            out[name] = Path(value)
        elif kinds.get(name) == "paths":
            out[name] = [Path(v) for v in value]
    return out


def load_run_config(path: Path, kinds: dict[str, str]) -> dict[str, FromFile]:
    """The options a config file sets, checked against `kinds`; relative paths resolved from its folder."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RunConfigError(f"--config {path}: cannot read it ({getattr(e, 'strerror', None) or e}); pass a "
                             "readable YAML file of run options, e.g. `interval: 1s`") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise RunConfigError(f"{path}{line}: not valid YAML ({getattr(e, 'problem', None) or e}); fix the syntax "
                             "(a mapping of run options, e.g. `interval: 1s`)") from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise RunConfigError(f"{path}:{root.start_mark.line + 1}: the config must be a mapping of run options, "
                             "e.g. `interval: 1s`")
    out: dict[str, FromFile] = {}
    for key_node, value_node in root.value:
        key = str(key_node.value)
        name = key.replace("-", "_")
        where = f"{path}:{key_node.start_mark.line + 1}: {key}"
        if name == "config":
            raise RunConfigError(f"{where}: a config file cannot name another; put the options in this one")
        if name not in kinds:
            raise RunConfigError(f"{where}: not an option of `run`{_did_you_mean(name, kinds)}; the keys are run's "
                                 "long options without the dashes in front, e.g. `scrape-timeout: 3s`")
        if name in out:
            raise RunConfigError(f"{where}: given twice (also {out[name].where}); keep one")
        value = yaml.SafeLoader(text).construct_document(value_node)
        out[name] = FromFile(_converted(value, kinds[name], where, path.parent), where)
    return out


def _converted(value: Any, kind: str, where: str, base: Path) -> Any:
    """A YAML value as the option's kind; RunConfigError naming what to write instead."""
    if kind in ("list", "paths"):
        items = value if isinstance(value, list) else [value]
        if not items or any(isinstance(i, (dict, list)) or i is None for i in items):
            raise RunConfigError(f"{where}: give one value or a list of values, e.g. [a, b]")
        return [_path(i, base) for i in items] if kind == "paths" else [str(i) for i in items]
    if isinstance(value, (dict, list)) or value is None:
        raise RunConfigError(f"{where}: expects one {'number' if kind == 'int' else 'value'}, not "
                             f"{'nothing' if value is None else type(value).__name__}")
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise RunConfigError(f"{where}: expects a whole number, got {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise RunConfigError(f"{where}: expects true or false, got {value!r}")
        return value
    return _path(value, base) if kind == "path" else str(value)


def _path(value: Any, base: Path) -> Path:
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else base / p


def _did_you_mean(name: str, kinds: dict[str, str]) -> str:
    close = difflib.get_close_matches(name, list(kinds), n=1)
    return f" (did you mean {close[0].replace('_', '-')}?)" if close else ""


def merged(defaults: dict[str, Any], from_file: dict[str, FromFile], given: dict[str, Any]) -> dict[str, Any]:
    """Defaults, then the file, then the command line: what is given on the command line wins."""
    values = dict(defaults)
    values.update({k: v.value for k, v in from_file.items()})
    values.update({k: v for k, v in given.items() if v is not None and v != () and v != [] and v is not False})
    return values


def locate(message: str, from_file: dict[str, FromFile]) -> str:
    """A message about `--some-option` prefixed with FILE:LINE when that option came from the config file."""
    if message.startswith("--"):
        flag = message[2:].split(" ", 1)[0].rstrip(":")
        hit = from_file.get(flag.replace("-", "_"))
        if hit is not None:
            return f"{hit.where.rsplit(': ', 1)[0]}: {message}"
    return message
