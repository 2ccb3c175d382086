"""What the store refuses before a transaction: samples it cannot hold, so one bad line never sinks a tick."""

from __future__ import annotations

from dataclasses import dataclass

# the store keeps ms since the epoch in hourly partitions named by a non-negative hour index, and
# DuckDB's TIMESTAMP (ns in 64 bits) ends on 2262-04-11: outside 1970..2262 a sample cannot be kept
MIN_TS_MS = 0
MAX_TS_MS = 9_223_372_036_854

FIXES = {
    "timestamp": "fix the exporter's clock or have it send samples without a timestamp",
    "labels": "fix the exporter so each label name appears once and every value is quoted",
}


@dataclass
class Rejected:
    """Samples of one batch the store refused for one reason: how many, the first one, and the fix."""

    batch: int  # index of the batch in the append_many call
    instance: str
    reason: str  # "timestamp" or "labels"
    count: int
    example: str  # the first refused sample, as metric{labels} and what was wrong with it

    @property
    def message(self) -> str:
        """One line: what was refused, why, and the fix."""
        return (f"store refused {self.count} sample(s) of {self.instance} ({self.reason}): {self.example}; "
                f"{FIXES[self.reason]}")


def timestamp_ok(ts: object) -> bool:
    """True when a sample time (ms since the epoch) fits the store: 1970..2262 (NaN and non-numbers fail)."""
    try:
        return MIN_TS_MS <= ts <= MAX_TS_MS  # type: ignore[operator]
    except TypeError:
        return False


def describe_timestamp(metric: str, text: str, ts: object) -> str:
    """The refused sample and its time, cut to a readable length."""
    return f"{metric}{{{text[:200]}}} at {str(ts)[:40]} is outside 1970..2262 (ms since the epoch)"


def describe_labels(metric: str, text: str, error: Exception) -> str:
    """The refused sample and what is wrong with its labels, on one line."""
    why = str(error).split(":", 1)[0].splitlines()[0][:200]
    return f"{metric}{{{text[:200]}}}: {why}"


class Refusals:
    """Collects refused samples per (batch, reason) while a tick's columns are built."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[int, str], Rejected] = {}
        self.total = 0

    def add(self, batch: int, instance: str, reason: str, example: str) -> None:
        """Count one refused sample; the first of each batch and reason is kept as the example."""
        self.total += 1
        r = self.by_key.get((batch, reason))
        if r is None:
            self.by_key[(batch, reason)] = Rejected(batch, instance, reason, 1, example)
        else:
            r.count += 1

    def __bool__(self) -> bool:
        return bool(self.by_key)

    def all(self) -> list[Rejected]:
        """Every refusal, in batch order."""
        return [self.by_key[k] for k in sorted(self.by_key)]
