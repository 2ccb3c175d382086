"""Answers of the PromQL engine: samples of an instant vector, series of a range, and an evaluation made one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_sentinel.agent.promql.parser import Unsupported
from vllm_sentinel.agent.promql.vectors import Str, labels_key


@dataclass
class Sample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


@dataclass
class Series:
    """One series of a range result: (t_ms, value) points in time order."""

    labels: dict[str, str]
    points: list[tuple[int, float]]


def instant_answer(val, j: int) -> list[Sample] | float:
    """Step j of an evaluation as an instant query's answer: a scalar, or the vector's samples by labels."""
    if isinstance(val, np.ndarray):
        return float(val[j])
    if isinstance(val, Str):
        raise Unsupported("unsupported: string-valued expression as a query result")
    out = [Sample(dict(val.keys[i]), float(val.v[i, j])) for i in range(len(val.keys)) if val.ok[i, j]]
    out.sort(key=lambda s: labels_key(s.labels))
    return out


def range_answer(val, t: np.ndarray) -> list[Series]:
    """An evaluation over the steps t as a range query's answer: one series per label set (by labels), or
    one without labels for a scalar."""
    if isinstance(val, np.ndarray):
        return [Series({}, [(int(a), float(b)) for a, b in zip(t, val)])]
    if isinstance(val, Str):
        raise Unsupported("unsupported: string-valued expression as a query result")
    out = []
    for i, key in enumerate(val.keys):
        mask = val.ok[i]
        if mask.any():
            out.append(Series(dict(key), [(int(a), float(b)) for a, b in zip(t[mask], val.v[i][mask])]))
    out.sort(key=lambda s: labels_key(s.labels))
    return out
