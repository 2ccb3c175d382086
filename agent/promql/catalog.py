"""The store's series table as label dicts for the engine: selector matching and label keys, cached
until a series is added."""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any

import duckdb

from vllm_sentinel.agent.promql.algebra import drop_name, labels_key
from vllm_sentinel.agent.promql.parser import PromQLError
from vllm_sentinel.agent.store import series_table


KEY_TUPLES = 4096  # selectors whose key tuples a catalog keeps (a rule pack has a few hundred)


class Catalog:
    """The store's series table at one version, as label dicts; selector results and label keys cached.

    A catalog never changes once built (its caches only fill): an engine takes the current one at
    the start of a query and uses it throughout, whatever other threads' queries load meanwhile.
    """

    def __init__(self, version: tuple[int, int] | None = None, base: "Catalog | None" = None) -> None:
        self.version = version
        # a grown catalog starts from its predecessor's series (same indexes) and label keys
        self.sids: list[int] = list(base.sids) if base else []
        self.labels: list[dict[str, str]] = list(base.labels) if base else []
        self._by_name: dict[str, list[int]] = ({k: list(v) for k, v in base._by_name.items()} if base else {})
        self._keys: dict[tuple[int, bool], tuple] = dict(base._keys) if base else {}
        self._match_cache: dict[tuple, list[int]] = {}
        self._key_tuples: dict[tuple[int, bool], tuple[list[int], tuple]] = {}
        self._regex: dict[str, re.Pattern] = dict(base._regex) if base else {}

    def _add(self, rows) -> None:
        for sid, instance, metric, labels in rows:
            d = dict(labels) if labels else {}
            if instance:
                d["instance"] = instance
            d["__name__"] = metric
            self._by_name.setdefault(metric, []).append(len(self.sids))
            self.sids.append(int(sid))
            self.labels.append(d)

    def keys(self, idx: list[int], keep_name: bool) -> tuple:
        """The label keys of these series (without __name__ unless keep_name), computed once per series.

        The same selector's idx (select's remembered list) gets the same tuple back every time, so work
        done on its keys is remembered by identity (keymemo.py).
        """
        slot = (id(idx), keep_name)
        hit = self._key_tuples.get(slot)
        if hit is not None and hit[0] is idx:
            return hit[1]
        cache = self._keys
        out = []
        for i in idx:
            got = cache.get((i, keep_name))
            if got is None:
                got = labels_key(self.labels[i])
                got = cache[(i, keep_name)] = got if keep_name else drop_name(got)
            out.append(got)
        keys = tuple(out)
        if len(self._key_tuples) < KEY_TUPLES:
            self._key_tuples[slot] = (idx, keys)  # idx held: its id is not reused while remembered
        return keys

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
        if hit is None:
            hit = self._match_cache[cache_key] = self._select(matchers)
        return hit

    def _select(self, matchers: list[tuple[str, str, str]]) -> list[int]:
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
        return out


class Catalogs:
    """The current Catalog of one store, replaced (never changed) when a series is added."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = Catalog()

    @property
    def version(self) -> tuple[int, int] | None:
        """The version of the catalog loaded last (None before the first load)."""
        return self._current.version

    def current(self, cur: duckdb.DuckDBPyConnection, version: tuple[int, int] | None = None) -> Catalog:
        """The catalog at the store's version (`version`: known already, else asked), loaded if it changed.

        Series ids dense from 0 that only grew (the daemon's own store) are read from the first new id
        on; anything else (a series removed, ids with gaps) loads the whole table.
        """
        version = version or series_table.series_version(cur)
        with self._lock:
            old = self._current
            if version == old.version:
                return old
            grew = (old.version is not None and old.version[0] == old.version[1] + 1
                    and version[0] == version[1] + 1 and version[0] > old.version[0] and len(old.sids) == old.version[0])
            new = Catalog(version, old if grew else None)
            new._add(series_table.series_labels(cur, from_id=old.version[0] if grew and old.version else None))
            self._current = new
            return new


_SHARED: "weakref.WeakKeyDictionary[Any, Catalogs]" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_catalogs(store: Any) -> Catalogs:
    """The Catalogs of this store, shared by every engine over it (its own for a store that cannot be keyed)."""
    with _SHARED_LOCK:
        try:
            got = _SHARED.get(store)
            if got is None:
                got = _SHARED[store] = Catalogs()
            return got
        except TypeError:  # not weakly referenceable
            return Catalogs()
