"""The instant vector of the PromQL engine over a grid of steps (Vec), label sets, and duplicate rows merged.

An instant vector over a grid of steps is a Vec: one row per label set, a (rows x steps) value
matrix and a presence mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_sentinel.agent.promql.keymemo import MEMO
from vllm_sentinel.agent.promql.parser import PromQLError

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs: hashable label set


@dataclass
class Vec:
    """An instant vector over all steps: row i has labels keys[i], values v[i], presence ok[i]."""

    keys: list[Labels]
    v: np.ndarray  # float64 (rows, steps)
    ok: np.ndarray  # bool (rows, steps)
    ts: np.ndarray | None = None  # int64 sample timestamps, for timestamp() of a selector

    @staticmethod
    def empty(n: int) -> "Vec":
        """A vector with no series over n steps."""
        return Vec([], np.zeros((0, n)), np.zeros((0, n), dtype=bool))


@dataclass
class Str:
    """A string value (only ever a function argument: label_replace's names and regex)."""

    value: str


def labels_key(labels: dict[str, str]) -> Labels:
    """The hashable, sorted form of a label dict."""
    return tuple(sorted(labels.items()))


def drop_name(key: Labels) -> Labels:
    """The label set without its metric name (what arithmetic and most functions return)."""
    return tuple(kv for kv in key if kv[0] != "__name__")


def drop_names(keys) -> tuple[Labels, ...]:
    """drop_name of every key, remembered for a key tuple."""
    return MEMO.get(keys, "drop_name", lambda: tuple(drop_name(k) for k in keys))


def dedupe(vec: Vec, whole_series: bool) -> Vec:
    """Merge rows with equal label sets; two of them present together is Prometheus' duplicate-labelset error.

    whole_series: Prometheus checks range-function and unary-minus results over the whole range,
    other results step by step.
    """
    if not MEMO.get(vec.keys, "duplicates", lambda: len(set(vec.keys)) != len(vec.keys)):
        return vec
    groups: dict[Labels, list[int]] = {}
    for i, k in enumerate(vec.keys):
        groups.setdefault(k, []).append(i)
    keys, vs, oks = [], [], []
    for k, rows in groups.items():
        if len(rows) == 1:
            keys.append(k)
            vs.append(vec.v[rows[0]])
            oks.append(vec.ok[rows[0]])
            continue
        sub_ok = vec.ok[rows]
        live = [r for r in rows if vec.ok[r].any()]
        if (whole_series and len(live) > 1) or (sub_ok.sum(axis=0) > 1).any():
            raise PromQLError("vector cannot contain metrics with the same labelset")
        keys.append(k)
        vs.append(np.where(sub_ok, vec.v[rows], 0.0).sum(axis=0))
        oks.append(sub_ok.any(axis=0))
    n = vec.v.shape[1]
    return Vec(keys, np.array(vs).reshape(len(keys), n), np.array(oks, dtype=bool).reshape(len(keys), n))
