"""The timed lines of a dump as columns: `name{labels} value timestamp` read with numpy and Arrow, not per line.

A dump (`promtool`'s OpenMetrics export, a scrape log with timestamps) holds millions of lines for a
few thousand series. `timed_columns` finds each line's last two spaces with numpy, casts the value and
timestamp tokens with Arrow, and interns each distinct `name{labels}` once, so a line costs a dict
lookup instead of a parse. Only lines of the plain shape qualify: one space before the value and one
before the time, a value that is a plain decimal number, an integer time in ms (text format) or a
decimal time in seconds (OpenMetrics). Every other line (comments, NaN or Inf values, exemplars,
anything malformed) is left to `exposition.parse`, by its line number, so it is read and named
exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TimedColumns", "plain_enough", "timed_columns"]

_NL, _SPACE = 10, 32
# value tokens Arrow's cast reads exactly as Python's float() does; NaN, Inf and anything else go the slow way
_DECIMAL = r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$"
_INTEGER = r"^-?[0-9]{1,18}$"
# bytes that make `parse` read lines differently from a split at '\n' (it turns \r into line ends, and
# str.splitlines, which numbers the lines of a dump's error, breaks at \x0b, \x0c and \x1c-\x1e too):
# every control character but '\n' and '\t'
_NOT_CONTROL = bytes(range(32, 128)) + b"\n\t"


@dataclass
class TimedColumns:
    """One chunk's plain timed lines as columns, and the line numbers of the others."""

    heads: list[bytes]  # distinct 'name{labels}' texts, in first-seen order
    codes: np.ndarray  # int64: per plain line, its head's index in `heads`
    values: np.ndarray  # float64
    stamps_ms: np.ndarray  # int64
    lines: np.ndarray  # int64: per plain line, its 0-based line number in the chunk
    other_lines: np.ndarray  # int64: 0-based numbers of the lines left to the per-line parser (blank ones left out)
    starts: np.ndarray  # int64: per line of the chunk, where it starts and ends (before its '\n')
    ends: np.ndarray
    indented: bool  # a line starts with a blank: parse strips every line of such a text, so it reads them all

    def line_text(self, chunk: bytes, line: int) -> str:
        """One line of the chunk, as text."""
        return chunk[self.starts[line]:self.ends[line]].decode("utf-8")


def plain_enough(data: bytes) -> bool:
    """True when a dump is ASCII without control characters other than '\\n' and '\\t': it splits at '\\n'
    into the lines `parse` reads (False: \\r, form feeds or UTF-8, for the per-line path)."""
    return data.isascii() and not data.translate(None, _NOT_CONTROL)


def _tokens(data: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """The byte ranges [lo, hi) copied out as one Arrow string array."""
    import pyarrow as pa  # the dump path's: a scrape does not pay the import

    lengths = hi - lo
    offsets = np.zeros(len(lo) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # every byte position of every token, in order: each range's start repeated, plus its rank within it
    pos = np.repeat(lo - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
    return pa.LargeStringArray.from_buffers(len(lo), pa.py_buffer(offsets), pa.py_buffer(data[pos].tobytes()))


def timed_columns(chunk: bytes, openmetrics: bool, max_ms: int) -> TimedColumns:
    """Split a chunk of whole lines (UTF-8, '\\n' line ends) into plain timed lines and the others; a time
    outside 0..max_ms (what the caller can store) leaves its line to the others."""
    import pyarrow as pa
    import pyarrow.compute as pc

    data = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(data == _NL)
    if len(data) and data[-1] != _NL:
        ends = np.append(ends, len(data))
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    spaces = np.flatnonzero(data == _SPACE)
    # the last two spaces before each line's end; a line with fewer than two of its own is not plain
    k = np.searchsorted(spaces, ends)
    sp_ts = spaces[np.maximum(k - 1, 0)] if len(spaces) else np.full_like(ends, -1)
    sp_val = spaces[np.maximum(k - 2, 0)] if len(spaces) else np.full_like(ends, -1)
    nonblank = ends > starts
    first = data[np.minimum(starts, max(len(data) - 1, 0))] if len(data) else np.zeros(0, np.uint8)
    plain = (nonblank & (k >= 2) & (sp_val > starts) & (sp_ts > sp_val + 1)
             & (ends > sp_ts + 1) & (first != ord("#")))
    if len(data):
        plain &= data[np.maximum(sp_val - 1, 0)] != _SPACE  # 'a  1 2': two spaces before the value
    idx = np.flatnonzero(plain)
    values = _tokens(data, sp_val[idx] + 1, sp_ts[idx])
    stamps = _tokens(data, sp_ts[idx] + 1, ends[idx])
    good = pc.and_(pc.match_substring_regex(values, _DECIMAL),
                   pc.match_substring_regex(stamps, _DECIMAL if openmetrics else _INTEGER))
    good_np = good.to_numpy(zero_copy_only=False)
    keep = idx[good_np]
    value_arr = pc.cast(values.filter(good), pa.float64()).to_numpy(zero_copy_only=False)
    if openmetrics:  # float seconds, as parse reads them: x * 1000, rounded half to even
        secs = pc.cast(stamps.filter(good), pa.float64()).to_numpy(zero_copy_only=False)
        with np.errstate(over="ignore", invalid="ignore"):  # 1e308 seconds: inf, outside, named per line
            ms = secs * 1000.0
        inside = np.isfinite(ms) & (ms >= 0) & (ms <= max_ms)
        stamp_arr = np.rint(np.where(inside, ms, 0)).astype(np.int64)
    else:
        stamp_arr = pc.cast(stamps.filter(good), pa.int64()).to_numpy(zero_copy_only=False)
        inside = (stamp_arr >= 0) & (stamp_arr <= max_ms)
    # times the caller cannot store: the per-line path names them
    keep, value_arr, stamp_arr = keep[inside], value_arr[inside], stamp_arr[inside]
    # C-level loops only: a million lines cost a bytes slice and a dict lookup each
    keys = list(map(chunk.__getitem__, map(slice, starts[keep].tolist(), sp_val[keep].tolist())))
    index = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    codes = np.fromiter(map(index.__getitem__, keys), dtype=np.int64, count=len(keys))
    taken = np.zeros(len(ends), dtype=bool)
    taken[keep] = True
    other = np.flatnonzero(~taken & nonblank)
    indented = bool(len(data)) and bool(np.any(nonblank & ((first == _SPACE) | (first == 9))))
    return TimedColumns(list(index), codes, value_arr, stamp_arr, keep, other, starts, ends, indented)

