"""The store's series table as label dicts for the engine: selector matching and label keys, cached
until a series is added."""

from __future__ import annotations

import re

import duckdb

from vllm_sentinel.agent.promql.algebra import drop_name, labels_key
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.store import series_table


class Catalog:
    """The store's series table as label dicts, with selector results cached until it changes."""

    def __init__(self) -> None:
        self.version: tuple[int, int] | None = None
        self.sids: list[int] = []
        self.labels: list[dict[str, str]] = []
        self._match_cache: dict[tuple, list[int]] = {}
        self._keys: dict[tuple[int, bool], tuple] = {}
        self._regex: dict[str, re.Pattern] = {}

    def refresh(self, cur: duckdb.DuckDBPyConnection, version: tuple[int, int] | None = None) -> None:
        """Reload the series table when a series was added since the last query (`version`: known already)."""
        version = version or series_table.series_version(cur)
        if version == self.version:
            return
        self.sids, self.labels = [], []
        for sid, instance, metric, labels in series_table.series_labels(cur):
            d = dict(labels) if labels else {}
            if instance:
                d["instance"] = instance
            d["__name__"] = metric
            self.sids.append(int(sid))
            self.labels.append(d)
        self._match_cache.clear()
        self._keys.clear()
        self.version = version

    def keys(self, idx: list[int], keep_name: bool) -> list:
        """The label keys of these series (without __name__ unless keep_name), computed once per series."""
        cache = self._keys
        out = []
        for i in idx:
            got = cache.get((i, keep_name))
            if got is None:
                got = labels_key(self.labels[i])
                got = cache[(i, keep_name)] = got if keep_name else drop_name(got)
            out.append(got)
        return out

    def _re(self, pattern: str) -> re.Pattern:
        rx = self._regex.get(pattern)
        if rx is None:
            try:
                rx = re.compile(f"(?:{pattern})")
            except re.error as e:
                raise PromQLError(f"invalid regular expression {pattern!r}: {e}") from e
            self._regex[pattern] = rx
        return rx

    def select(self, matchers: list[tuple[str, str, str]]) -> list[int]:
        """Indexes into sids/labels of the series matching every matcher (regexes fully anchored)."""
        cache_key = tuple(matchers)
        hit = self._match_cache.get(cache_key)
        if hit is not None:
            return hit
        out = []
        tests = []
        for name, op, value in matchers:
            if op == "=":
                tests.append(lambda d, n=name, v=value: d.get(n, "") == v)
            elif op == "!=":
                tests.append(lambda d, n=name, v=value: d.get(n, "") != v)
            elif op == "=~":
                rx = self._re(value)
                tests.append(lambda d, n=name, rx=rx: rx.fullmatch(d.get(n, "")) is not None)
            else:
                rx = self._re(value)
                tests.append(lambda d, n=name, rx=rx: rx.fullmatch(d.get(n, "")) is None)
        for i, d in enumerate(self.labels):
            if all(t(d) for t in tests):
                out.append(i)
        out.sort(key=lambda i: labels_key(self.labels[i]))
        self._match_cache[cache_key] = out
        return out
