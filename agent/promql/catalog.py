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
        self._by_name: dict[str, list[int]] = {}  # metric name -> indexes: a selector names one, nearly always
        self._match_cache: dict[tuple, list[int]] = {}
        self._keys: dict[tuple[int, bool], tuple] = {}
        self._regex: dict[str, re.Pattern] = {}

    def refresh(self, cur: duckdb.DuckDBPyConnection, version: tuple[int, int] | None = None) -> None:
        """Reload the series table when a series was added since the last query (`version`: known already).

        Series ids dense from 0 that only grew (the daemon's own store) are read from the first new id
        on; anything else (a series removed, ids with gaps) reloads the whole table.
        """
        version = version or series_table.series_version(cur)
        if version == self.version:
            return
        old = self.version
        grew = (old is not None and old[0] == old[1] + 1 and version[0] == version[1] + 1 and version[0] > old[0]
                and len(self.sids) == old[0])
        if not grew:
            self.sids, self.labels, self._by_name = [], [], {}
            self._keys.clear()
        rows = series_table.series_labels(cur, from_id=old[0] if grew and old else None)
        for sid, instance, metric, labels in rows:
            d = dict(labels) if labels else {}
            if instance:
                d["instance"] = instance
            d["__name__"] = metric
            self._by_name.setdefault(metric, []).append(len(self.sids))
            self.sids.append(int(sid))
            self.labels.append(d)
        self._match_cache.clear()
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
        candidates: list[int] | range = range(len(self.labels))
        for name, op, value in matchers:
            if name == "__name__" and op == "=":
                candidates = self._by_name.get(value, [])
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
        labels = self.labels
        for i in candidates:
            d = labels[i]
            if all(t(d) for t in tests):
                out.append(i)
        out.sort(key=lambda i: labels_key(self.labels[i]))
        self._match_cache[cache_key] = out
        return out
