"""Terminal sparklines (▁▂▃▄▅▆▇█) for the diagnose table and the Markdown evidence table."""

from __future__ import annotations

import math
from collections.abc import Sequence

BARS = "▁▂▃▄▅▆▇█"
GAP = " "  # a missing sample (NaN, None, inf): a hole, never a fake low bar


def _usable(v: float | None) -> bool:
    return v is not None and not math.isnan(v) and not math.isinf(v)


def resample(values: Sequence[float | None], width: int) -> list[float | None]:
    """Shrink `values` to at most `width` buckets, each the max of its slice (peaks must survive).

    resample([1, 5, 2, 2, None, None], 3) -> [5, 2, None]
    """
    n = len(values)
    if width <= 0:
        raise ValueError(f"sparkline width must be positive, got {width}")
    if n <= width:
        return list(values)
    out: list[float | None] = []
    for i in range(width):
        lo, hi = i * n // width, (i + 1) * n // width
        chunk = [v for v in values[lo:hi] if _usable(v)]
        out.append(max(chunk) if chunk else None)
    return out


def sparkline(values: Sequence[float | None], width: int | None = None,
              lo: float | None = None, hi: float | None = None) -> str:
    """One bar per value scaled between lo and hi (default: min and max); NaN/None become a blank.

    >>> sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    '▁▂▃▄▅▆▇█'
    >>> sparkline([1.0, float("nan"), 3.0, None, 2.0])
    '▁ █ ▅'
    >>> sparkline([2, 2, 2])
    '▄▄▄'
    >>> sparkline([])
    ''
    """
    vals = resample(values, width) if width is not None else list(values)
    good = [v for v in vals if _usable(v)]
    if not good:
        return GAP * len(vals)
    lo = min(good) if lo is None else lo
    hi = max(good) if hi is None else hi
    span = hi - lo
    out = []
    for v in vals:
        if not _usable(v):
            out.append(GAP)
        elif span <= 0:
            out.append(BARS[len(BARS) // 2 - 1])  # a flat line: mid-height, neither "zero" nor "max"
        else:
            frac = min(1.0, max(0.0, (v - lo) / span))
            out.append(BARS[min(len(BARS) - 1, int(round(frac * (len(BARS) - 1))))])
    return "".join(out)


def bucket_by_time(points: Sequence[tuple[int, float | None]], start_ms: int, end_ms: int,
                   width: int) -> list[float | None]:
    """Points (t_ms, value) into `width` equal time buckets over [start_ms, end_ms], max per bucket.

    A bucket no point falls in stays None, so a scrape gap shows as a gap even when the series
    simply has no points there (a range query leaves absent steps out).

    bucket_by_time([(0, 1.0), (10, 3.0), (90, 2.0)], 0, 100, 4) -> [3.0, None, None, 2.0]
    """
    if width <= 0:
        raise ValueError(f"sparkline width must be positive, got {width}")
    span = max(1, end_ms - start_ms)
    out: list[float | None] = [None] * width
    for t, v in points:
        if not start_ms <= t <= end_ms or not _usable(v):
            continue
        i = min(width - 1, (t - start_ms) * width // span)
        out[i] = v if out[i] is None else max(out[i], v)
    return out


def time_sparkline(points: Sequence[tuple[int, float | None]], start_ms: int, end_ms: int, width: int = 24,
                   lo: float | None = None, hi: float | None = None) -> str:
    """A sparkline of timestamped points over a time window (for the diagnose table and reports).

    >>> time_sparkline([(0, 0.0), (25, 1.0), (50, None), (75, 4.0)], 0, 100, width=4)
    '▁▃ █'
    """
    return sparkline(bucket_by_time(points, start_ms, end_ms, width), lo=lo, hi=hi)
