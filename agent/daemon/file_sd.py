"""Targets files in Prometheus' file_sd format: a list of `{targets: [host:port, ...], labels: {...}}`.

JSON for `.json`, YAML for `.yml`/`.yaml`, as Prometheus decides by the file name. The labels go
onto every series of those targets; `instance` names the instance (default: host:port),
`__scheme__` and `__metrics_path__` build the URL (default http and /metrics), and other `__`
labels are dropped, as Prometheus drops them once relabelling is done. Every problem is one
line naming the file, the line and the fix (`TargetsFileError`).

    - targets: [10.0.0.5:8000, 10.0.0.6:8000]
      labels: {job: vllm, model_name_group: llama}
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vllm_sentinel.collectors.vllm import default_instance, normalize_target

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_FORMATS = {".json": "json", ".yml": "yaml", ".yaml": "yaml"}
EXAMPLE = "- targets: [127.0.0.1:8000]\n  labels: {job: vllm}"


class TargetsFileError(ValueError):
    """A targets file that cannot be used; the message is one line: file:line, the problem, the fix."""


@dataclass(frozen=True)
class TargetSpec:
    """One scrape target: where to scrape, the instance label, the labels carried onto its series."""

    url: str
    instance: str
    labels: tuple[tuple[str, str], ...] = ()
    source: str = "--target"  # "--target", or FILE:LINE of the targets file entry

    @property
    def label_dict(self) -> dict[str, str]:
        """The carried labels as a dict."""
        return dict(self.labels)


@dataclass
class TargetsFile:
    """A targets file and what was last read from it; `changed()` is cheap (a stat, then a hash)."""

    path: Path
    _stat: tuple | None = None
    _digest: str | None = None
    specs: list[TargetSpec] = field(default_factory=list)

    def changed(self) -> bool:
        """True when the file differs from what was last looked at: a new stat, then a new content hash."""
        try:
            st = os.stat(self.path)
            signature: tuple = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            signature = ("missing",)
        if signature == self._stat:
            return False
        self._stat = signature
        if signature == ("missing",):
            return True  # a reload says so once, and keeps the running targets
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest() != self._digest
        except OSError:
            return True

    def read(self) -> list[TargetSpec]:
        """Read and parse the file; on success it becomes the reference for `changed()`."""
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise TargetsFileError(f"{self.path}: cannot read the targets file ({e.strerror or e}); check the path "
                                   "given to --targets-file and its permissions") from None
        self.specs = parse_targets(data, self.path)
        self._digest = hashlib.sha256(data).hexdigest()
        return self.specs


def parse_targets(data: bytes, path: Path) -> list[TargetSpec]:
    """The targets of a file_sd file's bytes; TargetsFileError (file:line) on anything Prometheus would refuse."""
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise TargetsFileError(f"{path}: a targets file must end in .json, .yml or .yaml (as for Prometheus' "
                               "file_sd); rename it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TargetsFileError(f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    if not text.strip():
        # a writer that truncates before writing leaves an empty file for a moment: keep what runs
        raise TargetsFileError(f"{path}: the targets file is empty; write [] to mean no targets, or a list such as "
                               f"{EXAMPLE!r}")
    root = _compose(text, path, kind)
    if not isinstance(root, yaml.SequenceNode):
        raise TargetsFileError(f"{_at(path, root)}: the file must be a list of target groups, e.g. {EXAMPLE!r}")
    specs: list[TargetSpec] = []
    seen: dict[str, str] = {}
    for group in root.value:
        for spec in _group(group, path):
            if spec.instance in seen:
                raise TargetsFileError(f"{spec.source}: instance {spec.instance} is already listed at {seen[spec.instance]}; "
                                       "list each target once (or give them different `instance` labels)")
            seen[spec.instance] = spec.source
            specs.append(spec)
    return specs


def _compose(text: str, path: Path, kind: str) -> yaml.Node:
    """The document as YAML nodes (they carry line numbers); syntax errors name the line."""
    if kind == "json":
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise TargetsFileError(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); fix the syntax "
                                   "or use a .yaml file") from None
        text = text.replace("\t", " ")  # valid JSON holds tabs only as blanks between tokens; YAML refuses them
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise TargetsFileError(f"{path}{line}: not valid YAML ({problem}); fix the syntax, e.g. {EXAMPLE!r}") from None


def _at(path: Path, node: yaml.Node | None) -> str:
    return f"{path}:{node.start_mark.line + 1}" if node is not None else str(path)


def _group(node: yaml.Node, path: Path) -> list[TargetSpec]:
    """One `{targets, labels}` entry -> its targets."""
    if not isinstance(node, yaml.MappingNode):
        raise TargetsFileError(f"{_at(path, node)}: each entry must be a mapping with `targets` (and `labels`), "
                               f"e.g. {EXAMPLE!r}")
    targets: list[yaml.Node] = []
    labels: dict[str, str] = {}
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        if name == "targets":
            if not isinstance(value, yaml.SequenceNode):
                raise TargetsFileError(f"{_at(path, value)}: `targets` must be a list of host:port, e.g. "
                                       "[127.0.0.1:8000]")
            targets = value.value
        elif name == "labels":
            labels = _labels(value, path)
        else:
            raise TargetsFileError(f"{_at(path, key)}: unknown key {name!r} in a target group; only `targets` and "
                                   "`labels` are allowed (Prometheus' file_sd format)")
    return [_target(t, labels, path) for t in targets]


def _labels(node: yaml.Node, path: Path) -> dict[str, str]:
    if not isinstance(node, yaml.MappingNode):
        raise TargetsFileError(f"{_at(path, node)}: `labels` must be a mapping of label names to strings, "
                               "e.g. {job: vllm}")
    labels: dict[str, str] = {}
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else ""
        if not _LABEL_NAME.match(name):
            raise TargetsFileError(f"{_at(path, key)}: {name!r} is not a valid label name; use letters, digits "
                                   "and _, not starting with a digit")
        if not isinstance(value, yaml.ScalarNode) or value.tag.endswith(":null"):
            raise TargetsFileError(f"{_at(path, value)}: label {name} must have a string value, e.g. {name}: \"x\"")
        labels[name] = value.value
    return labels


def _target(node: yaml.Node, labels: dict[str, str], path: Path) -> TargetSpec:
    """host:port (or a URL) plus the group's labels -> a TargetSpec."""
    where = _at(path, node)
    if not isinstance(node, yaml.ScalarNode) or not node.value.strip():
        raise TargetsFileError(f"{where}: a target must be a host:port string, e.g. 127.0.0.1:8000")
    address = node.value.strip()
    if "://" not in address:
        scheme = labels.get("__scheme__", "http")
        metrics_path = labels.get("__metrics_path__", "/metrics")
        if not metrics_path.startswith("/"):
            metrics_path = "/" + metrics_path
        address = f"{scheme}://{address}{metrics_path}"
    try:
        url = normalize_target(address)
    except ValueError as e:
        raise TargetsFileError(f"{where}: {e}") from None
    carried = {k: v for k, v in labels.items() if not k.startswith("__") and k != "instance"}
    instance = labels.get("instance") or default_instance(url)
    return TargetSpec(url=url, instance=instance, labels=tuple(sorted(carried.items())), source=where)
