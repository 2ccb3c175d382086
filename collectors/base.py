"""The one shape every collector returns: a Batch of samples plus a status, never an exception."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol


def now_ms() -> int:
    """Wall-clock time in integer milliseconds, the store's time unit (as Prometheus)."""
    return int(time.time() * 1000)


def escape_label_value(value: str) -> str:
    """Escape a label value for the text exposition format: 'a"b' -> 'a\\"b'."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: dict[str, str]) -> str:
    """Canonical label text, sorted, without braces: {'b': '2', 'a': '1'} -> 'a="1",b="2"'."""
    return ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in sorted(labels.items()))


@dataclass
class Event:
    """A discrete happening with a time (an XID error, a py-spy capture, a config change)."""

    ts_ms: int
    instance: str
    kind: str
    labels: dict[str, str] = field(default_factory=dict)
    message: str = ""


@dataclass
class CollectorStatus:
    """Health of one collector or target after its last run, shown by `vllm-sentinel status`."""

    name: str
    ok: bool = True
    error: str | None = None  # one line: what failed and, where we know it, the fix
    detail: dict[str, object] = field(default_factory=dict)


@dataclass
class Batch:
    """Samples from one collection of one instance, as parallel columns (one entry per sample).

    `labels` holds label text as in the exposition format, without braces and without
    `instance` (the store adds it): 'engine="0",model_name="m"'. A sample whose timestamp is
    None was taken at `ts_ms`. A value of None is a staleness marker (Prometheus' StaleNaN).
    """

    instance: str
    ts_ms: int
    metrics: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    timestamps_ms: list[int | None] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    status: CollectorStatus | None = None
    # canonical metric name -> the name the source used (only where they differ, e.g. an old alias)
    sources: dict[str, str] = field(default_factory=dict)

    def add(self, metric: str, labels: str | dict[str, str], value: float | None,
            ts_ms: int | None = None) -> None:
        """Append one sample; labels may be a dict (formatted canonically) or label text."""
        if isinstance(labels, dict):
            labels = format_labels(labels)
        self.metrics.append(metric)
        self.labels.append(labels)
        self.values.append(value)
        self.timestamps_ms.append(ts_ms)

    def __len__(self) -> int:
        return len(self.metrics)


class Collector(Protocol):
    """A source of samples; what it reads (HTTP, NVML, py-spy) is injected at construction."""

    name: str

    def collect(self, now_ms: int) -> Batch:
        """Collect once; a failing source returns a partial Batch whose status says why."""
        ...
