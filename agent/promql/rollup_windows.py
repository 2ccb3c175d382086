"""Range functions over long windows from the store's five-minute rollups plus raw samples at the edges.

A window [ref - range, ref] splits into three pieces, in time order: raw samples up to the first
whole block (the head), the whole blocks already rolled up, and raw samples after them (the
tail). Each piece gives its count, first and last sample, min, max, sum and the counter-reset
corrections in time order; the pieces combine in order, a reset between two pieces adding the
earlier one's last value. So count/first/last/min/max and the reset corrections are those of
the raw samples, and rate/increase/delta, count/min/max/last/present_over_time equal the raw
answer bit for bit. sum_over_time and avg_over_time add per-block sums (Kahan-compensated), and
a block where a series dropped more than rollups.MAX_LISTED_RESETS times (a gauge, not a counter)
keeps the sum of its corrections: those equal the raw answer to rounding, not to the last bit.

Example: increase(x[24h]) at 12:02:30 reads raw samples in [12:02:30 yesterday, 12:05), the
rollups of the 287 blocks from 12:05 yesterday to 12:00 today, and raw samples in [12:00, 12:02:30].
"""

from __future__ import annotations

import numpy as np

from vllm_sentinel.agent.promql import functions as fn
from vllm_sentinel.agent.promql import windows
from vllm_sentinel.agent.store import rollups, window_sql

# the functions a piece's summary answers; others (quantile, deriv, changes, ...) read every sample
FUNCTIONS = {"rate", "increase", "delta", "count_over_time", "sum_over_time", "avg_over_time",
             "min_over_time", "max_over_time", "last_over_time", "present_over_time"}
EXACT = FUNCTIONS - {"sum_over_time", "avg_over_time"}
MIN_RANGE_MS = 2 * rollups.BLOCK_MS  # shorter windows read their samples: few, and the edges would be most of them
MAX_INTERVALS = 128  # raw edge intervals per query (two per step); a range query with more steps reads raw
MEMO_KEEP = 8  # windows' pieces an engine keeps for the next queries


class _Pieces:
    """Per (series row, step): one piece's summary, dense arrays of shape (rows, steps)."""

    def __init__(self, rows: int, steps: int):
        shape = (rows, steps)
        self.n = np.zeros(shape, dtype=np.int64)
        self.first_ts = np.zeros(shape, dtype=np.int64)
        self.first_v = np.full(shape, np.nan)
        self.last_ts = np.zeros(shape, dtype=np.int64)
        self.last_v = np.full(shape, np.nan)
        self.min = np.full(shape, np.nan)
        self.max = np.full(shape, np.nan)
        self.sum = np.zeros(shape)
        self.n_corr = np.zeros(shape, dtype=np.int64)
        self.corr_at = np.zeros(shape, dtype=np.int64)  # first index into corrections
        self.corrections = np.zeros(0)


def _fill(p: _Pieces, s: windows.Samples, w: windows.Windows, corr_flat: np.ndarray, corr_first: np.ndarray,
          corr_count: np.ndarray, sums: np.ndarray, mins: np.ndarray, maxs: np.ndarray, counts: np.ndarray) -> None:
    r, j = w.rows, w.steps
    p.n[r, j] = counts
    p.first_ts[r, j], p.first_v[r, j] = s.ts[w.a], s.val[w.a]
    p.last_ts[r, j], p.last_v[r, j] = s.ts[w.b], s.val[w.b]
    p.min[r, j], p.max[r, j], p.sum[r, j] = mins, maxs, sums
    p.n_corr[r, j], p.corr_at[r, j] = corr_count, corr_first
    p.corrections = corr_flat


def _sum(s: windows.Samples, w: windows.Windows) -> np.ndarray:
    ((total, c),) = windows._kahan_sums(s, w, 1, lambda v, ts, ref: (v,))
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(total), total, total + c)


def _raw_piece(s: windows.Samples, w: windows.Windows, rows: int, steps: int) -> _Pieces:
    """A piece read from raw samples: its resets are the sample pairs that drop inside it."""
    p = _Pieces(rows, steps)
    if not len(w.a):
        return p
    prefix = windows._pair_prefix(s, windows._reset_pairs(s))
    positions = np.nonzero(np.diff(prefix))[0] + 1
    _fill(p, s, w, s.val[positions - 1], prefix[w.a], prefix[w.b] - prefix[w.a], _sum(s, w),
          windows._min_max(s, w, is_max=False), windows._min_max(s, w, is_max=True), w.n)
    return p


def _block_piece(blocks: dict[str, np.ndarray], sids: list[int], b_start: np.ndarray, b_end: np.ndarray,
                 rows: int, steps: int) -> _Pieces:
    """The whole blocks [b_start, b_end) of each step, combined from their rollup rows."""
    p = _Pieces(rows, steps)
    sid = blocks["series_id"].astype(np.int64)
    if not len(sid):
        return p
    by_sid = np.argsort(np.asarray(sids, dtype=np.int64), kind="stable")
    rank = np.searchsorted(np.asarray(sids, dtype=np.int64)[by_sid], sid)
    block = blocks["block"].astype(np.int64)
    first_v, last_v = blocks["first_v"].astype(np.float64), blocks["last_v"].astype(np.float64)
    # the blocks as "samples" whose time is the block number: one window per (series, step)
    as_first = windows.Samples(rank, block, first_v, by_sid)
    w = windows.locate_between(as_first, b_start, b_end - 1)
    if not len(w.a):
        return p
    n_cum = np.concatenate([[0], np.cumsum(blocks["n"].astype(np.int64))])
    # each block row's corrections in time order: the reset at the boundary with the series' previous
    # block (its first value below that block's last), then the resets inside it
    same = np.zeros(len(sid), dtype=bool)
    same[1:] = rank[1:] == rank[:-1]
    boundary = np.zeros(len(sid), dtype=bool)
    boundary[1:] = same[1:] & (first_v[1:] < last_v[:-1])
    internal = blocks["n_resets"].astype(np.int64)
    per_row = boundary.astype(np.int64) + internal
    start = np.concatenate([[0], np.cumsum(per_row)])
    flat = np.empty(int(start[-1]))
    inner = blocks["corrections"]
    inner_at = np.concatenate([[0], np.cumsum(internal)])
    for k in np.nonzero(per_row)[0].tolist():  # rare: resets are a handful a day
        at = int(start[k])
        if boundary[k]:
            flat[at] = last_v[k - 1]
            at += 1
        flat[at:at + internal[k]] = inner[inner_at[k]:inner_at[k + 1]]
    first_corr = start[w.a] + boundary[w.a]  # the boundary before the window's first block is outside it
    count = start[w.b + 1] - first_corr
    sums = windows.Samples(rank, block, blocks["sum_v"].astype(np.float64), by_sid)
    mins = windows.Samples(rank, block, blocks["min_v"].astype(np.float64), by_sid)
    maxs = windows.Samples(rank, block, blocks["max_v"].astype(np.float64), by_sid)
    _fill(p, as_first, w, flat, first_corr, count, _sum(sums, w), windows._min_max(mins, w, is_max=False),
          windows._min_max(maxs, w, is_max=True), n_cum[w.b + 1] - n_cum[w.a])
    p.first_ts[w.rows, w.steps] = blocks["first_ts"].astype(np.int64)[w.a]
    p.last_ts[w.rows, w.steps] = blocks["last_ts"].astype(np.int64)[w.b]
    p.last_v[w.rows, w.steps] = last_v[w.b]
    return p


def _intervals(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """The non-empty closed intervals, overlapping or touching ones merged."""
    spans = sorted((int(a), int(b)) for a, b in zip(starts, ends) if b >= a)
    out: list[list[int]] = []
    for a, b in spans:
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def evaluate(name: str, cur, store, sids: list[int], ref: np.ndarray, range_ms: int, memo: dict | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(rows, steps, values, ok) of range function `name` over [ref - range_ms, ref] for each step, from
    rollups where whole blocks are rolled; None when no step has one (read the samples instead).

    memo: pieces kept by (series, steps, range) for the caller's next query: a summary asks p50 and p95
    of one histogram, rate and increase of one counter, over the same window.
    """
    resets = name in ("rate", "increase")  # only these add counter-reset corrections
    writes = getattr(store, "writes", None)  # anything written since, or rolled since: not the same pieces
    key = (tuple(sids), ref.tobytes(), range_ms, resets, writes.mark() if writes else None, store._rolled_until)
    if memo is not None and key in memo:
        pieces = memo[key]
    else:
        pieces = _pieces(cur, store, sids, ref, range_ms, resets)
        if memo is not None:
            if len(memo) >= MEMO_KEEP:
                memo.pop(next(iter(memo)))
            memo[key] = pieces
    if pieces is None:
        return None
    return _combine(name, pieces, ref - range_ms, ref, range_ms)


def _pieces(cur, store, sids: list[int], ref: np.ndarray, range_ms: int, resets: bool) -> list[_Pieces] | None:
    """Head, whole blocks and tail of every (series, step) window (the blocks' resets read only when
    `resets`); None when no step has a rolled block."""
    b = rollups.BLOCK_MS
    lo, hi = ref - range_ms, ref
    b1 = -(-lo // b)
    b2 = np.minimum((hi + 1) // b, store._rolled_until // b)
    use = b2 > b1
    if not use.any():
        return None
    head_end = np.where(use, b1 * b - 1, hi)
    tail_start = np.where(use, b2 * b, hi + 1)
    # a window ending on a block boundary (a trend's steps) holds that one millisecond of the next block:
    # its sample there, if any, is that block's first, which its rollup row has when it is rolled
    point = use & (tail_start == hi) & (hi % b == 0) & (hi // b < store._rolled_until // b)
    raw_tail_start = np.where(point, hi + 1, tail_start)
    spans = _intervals(np.concatenate([lo, raw_tail_start]), np.concatenate([head_end, hi]))
    if len(spans) > MAX_INTERVALS:
        return None
    rows, steps = len(sids), len(ref)
    s = windows.Samples(*window_sql.interval_samples(cur, store.samples_sql, sids, spans))
    head = _raw_piece(s, windows.locate_between(s, lo, head_end), rows, steps)
    tail = _raw_piece(s, windows.locate_between(s, raw_tail_start, hi), rows, steps)
    b_start, b_end = np.where(use, b1, 0), np.where(use, b2, 0)
    b_last = int(max(b2[use].max(), (hi[point] // b).max() + 1 if point.any() else 0))
    blocks = rollups.read_blocks(cur, sids, int(b1[use].min()), b_last, corrections=resets)
    mid = _block_piece(blocks, sids, b_start, b_end, rows, steps)
    if point.any():
        _first_of_blocks(tail, blocks, sids, np.where(point, hi // b, -1))
    return [head, mid, tail]


def _first_of_blocks(p: _Pieces, blocks: dict[str, np.ndarray], sids: list[int], block_of_step: np.ndarray) -> None:
    """Into piece p: for each step with a block (>= 0), the sample at that block's very start, where there is one."""
    sid = blocks["series_id"].astype(np.int64)
    if not len(sid):
        return
    by_sid = np.argsort(np.asarray(sids, dtype=np.int64), kind="stable")
    rank = np.searchsorted(np.asarray(sids, dtype=np.int64)[by_sid], sid)
    block = blocks["block"].astype(np.int64)
    w = windows.locate_between(windows.Samples(rank, block, np.zeros(len(sid)), by_sid), block_of_step, block_of_step)
    first_ts = blocks["first_ts"].astype(np.int64)[w.a]
    at_start = first_ts == block[w.a] * rollups.BLOCK_MS
    r, j, k = w.rows[at_start], w.steps[at_start], w.a[at_start]
    v = blocks["first_v"].astype(np.float64)[k]
    p.n[r, j] = 1
    p.first_ts[r, j] = p.last_ts[r, j] = first_ts[at_start]
    p.first_v[r, j] = p.last_v[r, j] = p.min[r, j] = p.max[r, j] = p.sum[r, j] = v
    p.n_corr[r, j] = 0


def _combine(name: str, pieces: list[_Pieces], lo: np.ndarray, hi: np.ndarray, range_ms: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of each (row, step) in time order -> the function's value where any sample was."""
    n = sum(p.n for p in pieces)
    rows, steps = np.nonzero(n)
    n = n[rows, steps]
    shape = (len(rows),)
    first_ts, first_v = np.zeros(shape, dtype=np.int64), np.full(shape, np.nan)
    last_ts, last_v = np.zeros(shape, dtype=np.int64), np.full(shape, np.nan)
    got = np.zeros(shape, dtype=bool)
    lo_min, hi_max = np.full(shape, np.nan), np.full(shape, np.nan)
    total, c = np.zeros(shape), np.zeros(shape)
    for p in pieces:
        has = p.n[rows, steps] > 0
        take_first = has & ~got
        first_ts[take_first] = p.first_ts[rows, steps][take_first]
        first_v[take_first] = p.first_v[rows, steps][take_first]
        last_ts[has], last_v[has] = p.last_ts[rows, steps][has], p.last_v[rows, steps][has]
        got |= has
        lo_min = np.where(has, np.fmin(lo_min, p.min[rows, steps]), lo_min)
        hi_max = np.where(has, np.fmax(hi_max, p.max[rows, steps]), hi_max)
        t2, c2 = fn.kahan_inc(np.where(has, p.sum[rows, steps], 0.0), total, c)
        total, c = np.where(has, t2, total), np.where(has, c2, c)
    ok = np.ones(shape, dtype=bool)
    if name == "count_over_time":
        return rows, steps, n.astype(np.float64), ok
    if name == "present_over_time":
        return rows, steps, np.ones(shape), ok
    if name == "last_over_time":
        return rows, steps, last_v, ok
    if name == "min_over_time":
        return rows, steps, lo_min, ok
    if name == "max_over_time":
        return rows, steps, hi_max, ok
    with np.errstate(invalid="ignore"):
        summed = np.where(np.isinf(total), total, total + c)
    if name == "sum_over_time":
        return rows, steps, summed, ok
    if name == "avg_over_time":
        return rows, steps, summed / n, ok
    resets = None if name == "delta" else _corrections(pieces, rows, steps)
    values, ok = fn.extrapolated_rate(n, first_ts, first_v, last_ts, last_v, resets, lo[steps], hi[steps],
                                      range_ms / 1000, is_counter=name != "delta", is_rate=name == "rate")
    return rows, steps, values, ok


def _corrections(pieces: list[_Pieces], rows: np.ndarray, steps: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Counter-reset corrections of each window in time order: each piece's own, and the drop between two pieces."""
    flat: list[float] = []
    count = np.zeros(len(rows), dtype=np.int64)
    first = np.zeros(len(rows), dtype=np.int64)
    maybe = np.zeros(len(rows), dtype=bool)
    for p in pieces:
        maybe |= p.n_corr[rows, steps] > 0
    present = [p.n[rows, steps] > 0 for p in pieces]
    # a drop between consecutive non-empty pieces: find windows where any piece follows another
    for i in range(len(pieces)):
        for k in range(i + 1, len(pieces)):
            between = present[i] & present[k]
            for m in range(i + 1, k):
                between &= ~present[m]
            drop = between & (pieces[k].first_v[rows, steps] < pieces[i].last_v[rows, steps])
            maybe |= drop
    for w in np.nonzero(maybe)[0].tolist():
        r, j = rows[w], steps[w]
        first[w] = len(flat)
        previous = None
        for p in pieces:
            if p.n[r, j] == 0:
                continue
            if previous is not None and p.first_v[r, j] < previous.last_v[r, j]:
                flat.append(float(previous.last_v[r, j]))
            at, k = int(p.corr_at[r, j]), int(p.n_corr[r, j])
            flat.extend(p.corrections[at:at + k].tolist())
            previous = p
        count[w] = len(flat) - first[w]
    if not flat:
        return None
    return count, first, np.asarray(flat)
