"""New series and samples as numpy columns DuckDB scans for an INSERT."""

from __future__ import annotations

import numpy as np

_NAN_SQL = "'NaN'::DOUBLE"


def _objects(items: list) -> np.ndarray:
    """A 1-d object array of `items` as they are (np.array would make a list of lists two-dimensional)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def series_frame(rows: list[tuple[int, str, str, dict[str, str], str, str]]) -> dict[str, np.ndarray]:
    """New series as numpy columns DuckDB scans (labels as key and value lists, made a MAP in SQL).

    Numpy, not Arrow: the daemon then never loads pyarrow (about 30 MiB of its RSS)."""
    return {
        "series_id": np.fromiter((r[0] for r in rows), np.uint32, len(rows)),
        "instance": _objects([r[1] for r in rows]),
        "metric": _objects([r[2] for r in rows]),
        "label_keys": _objects([list(r[3]) for r in rows]),
        "label_values": _objects([list(r[3].values()) for r in rows]),
        "labels_text": _objects([r[4] for r in rows]),
        "source_metric": _objects([r[5] for r in rows]),
    }


def samples_frames(ts_col: list[int] | np.ndarray, sid_col: list[int] | np.ndarray,
                   val_col: list[float | None] | np.ndarray) -> list[tuple[dict[str, np.ndarray], str]]:
    """The samples as numpy columns DuckDB scans, each frame with the SQL of its value column.

    DuckDB reads a NaN in a numpy column as NULL, and numpy makes None a NaN. So the samples whose value is
    NaN are looked at again (rare: a NaN gauge, or a staleness marker, a None stored as NULL) and go apart
    in frames of their own, whose value the INSERT writes as a constant."""
    ts = np.asarray(ts_col, dtype=np.int64)
    sids = np.asarray(sid_col, dtype=np.uint32)
    values = np.asarray(val_col, dtype=np.float64)
    nan_at = np.flatnonzero(np.isnan(values))
    if not len(nan_at):
        return [({"ts": ts, "series_id": sids, "value": values}, "value")]
    if isinstance(val_col, np.ndarray):
        stale = np.zeros(len(nan_at), dtype=bool)
    else:
        stale = np.fromiter((val_col[i] is None for i in nan_at), bool, len(nan_at))
    keep = np.ones(len(values), dtype=bool)
    keep[nan_at] = False
    frames = [({"ts": ts[keep], "series_id": sids[keep], "value": values[keep]}, "value")]
    for rows, value_sql in ((nan_at[~stale], _NAN_SQL), (nan_at[stale], "NULL")):
        if len(rows):
            frames.append(({"ts": ts[rows], "series_id": sids[rows]}, value_sql))
    return frames
