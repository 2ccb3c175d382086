"""A fast parser for the Prometheus text format (0.0.4) and OpenMetrics text, as pure functions.

`parse()` keeps label text raw (as scraped, without braces) so a scrape of 1,000 lines costs well
under a millisecond; `parse_labels()` turns label text into a dict, once per new series.
`prometheus_client.parser` gives the same samples about 20x slower (bench/parse.py measures it).
Not supported: OpenMetrics 2.0 UTF-8 names quoted inside the braces (`{"my.metric",a="b"}`); the
collector asks for text 0.0.4, where vLLM's `vllm:` names are plain legacy names.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

__all__ = ["MAX_TIMESTAMP_MS", "MIN_TIMESTAMP_MS", "ParseError", "Parsed", "Shape", "looks_openmetrics", "parse",
           "parse_labels"]

# Legacy metric names (colons allowed) and label names, as in the text format spec.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One label pair at a time, from the start of the list or after a comma. Each character has one
# way to match (the value is runs of plain characters between escapes; no two quantifiers can share
# a blank), so a failed match backtracks over one run at most: linear in a hostile line's length.
_LABEL_ITER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"\s*(?:,|$)', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_UNESCAPE = {"\\": "\\", "n": "\n", '"': '"'}

# 'name{labels}' texts already proven well formed -> (name, label text). Shared by all callers:
# a server sends the same text every scrape, so splitting and validation cost once per series,
# not once per sample, and the same string objects (hashes cached) reach the store. Bounded.
_valid_heads: dict[str, tuple[str, str]] = {}
_HEAD_CACHE_MAX = 100_000  # about 20 MiB at most; a 0.32 server has ~1k series
# Sample suffixes that belong to typed families (OpenMetrics counters, histograms, summaries).
_CREATED = "_created"
# Sane sample times, in ms: what a date can show (Python's datetime spans years 1 to 9999). Outside
# them a timestamp is a unit mix-up or garbage, and 2^63 or 1e400 would not fit the store anyway.
MIN_TIMESTAMP_MS = -62_135_596_800_000
MAX_TIMESTAMP_MS = 253_402_300_799_999


class ParseError(ValueError):
    """A malformed exposition line; names its 1-based line number and content."""

    def __init__(self, line_no: int, line: str, reason: str) -> None:
        self.line_no = line_no
        self.line = line
        self.reason = reason
        shown = line if len(line) <= 160 else line[:157] + "..."
        super().__init__(f"line {line_no}: {reason}: {shown!r}")


@dataclass
class Parsed:
    """Samples of one exposition as parallel lists (one entry per sample), plus family types.

    `labels` is label text as scraped, without braces: 'engine="0",model_name="m"' ('' for none).
    `timestamps_ms` is None where the line had no timestamp. `types` maps family name -> type
    from `# TYPE` lines. `errors` lists lines skipped in lenient mode (strict mode raises).
    """

    names: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    timestamps_ms: list[int | None] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    errors: list[ParseError] = field(default_factory=list)
    openmetrics: bool = False
    dropped_created: int = 0
    # with keep_shape: the exposition's shape, when every sample line was plain (see Shape)
    shape: Shape | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True, eq=False)
class Shape:
    """Everything a clean parse learned from an exposition but its sample values.

    A server sends the same lines every scrape with new values. When the next body has the same text
    before each line's last blank (`heads`) and the same comment and blank lines, it holds the same
    series in the same order, so `parse(..., shape=)` reads only the values. Kept only for a parse
    without errors whose every sample line was plain 'name{labels} value' (no timestamp, no exemplar).
    """

    heads: list[str]
    verbatim: list[int]  # lines compared whole: comments, blank lines, anything after '# EOF'
    texts: list[str]
    samples: list[int]  # line of each sample, in order
    created: list[int]  # lines of dropped *_created samples: their values must still be numbers
    names: list[str]
    labels: list[str]
    types: dict[str, str]
    openmetrics: bool


def looks_openmetrics(text: str, content_type: str | None = None) -> bool:
    """True when the payload is OpenMetrics: by Content-Type, else by a final `# EOF` line."""
    if content_type is not None and "openmetrics" in content_type.lower():
        return True
    return text.rstrip().endswith("\n# EOF") or text.strip() == "# EOF"


def _unescape(value: str) -> str:
    # Only \\, \n and \" are escapes; any other backslash stays as written (as prometheus_client).
    return _ESCAPE.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(0)), value)


def parse_labels(text: str) -> dict[str, str]:
    """Label text to a dict: 'a="1",b="x\\"y"' -> {'a': '1', 'b': 'x"y'}; ValueError if malformed."""
    labels: dict[str, str] = {}
    if not text or text.isspace():
        return labels
    problem = _scan_labels(text, labels)
    if problem is not None:
        raise ValueError(f"{problem}: {text!r}")
    return labels


def _scan_labels(text: str, into: dict[str, str] | None = None) -> str | None:
    """Why label text is malformed, or None; fills `into` with unescaped values. Linear time."""
    seen: set[str] = set()
    pos, end = 0, len(text)
    match = _LABEL_ITER.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            # After a trailing comma only blanks may follow; an empty list '{ }' is not a pair.
            if pos > 0 and text[pos - 1] == "," and text[pos:].isspace():
                return None
            return f"malformed labels at character {pos}"
        name = m.group(1)
        if name in seen:
            # Prometheus refuses the whole line; storing either value would be a guess.
            return f"label {name!r} given twice"
        seen.add(name)
        if into is not None:
            value = m.group(2)
            into[name] = _unescape(value) if "\\" in value else value
        pos = m.end()
    return None


def _label_end(line: str, start: int) -> int:
    """Index of the '}' closing the label list that starts at `start`, skipping quoted values."""
    pos = start
    close = line.find("}", pos)
    while True:
        if close == -1:
            return -1
        if close < pos:  # that brace sat inside a quoted value: look again, from here on only
            close = line.find("}", pos)
            continue
        quote = line.find('"', pos, close)
        if quote == -1:
            return close
        pos = quote + 1
        while True:  # to the closing quote, past escaped ones
            quote = line.find('"', pos)
            if quote == -1:
                return -1
            backslashes = 0
            k = quote - 1
            while line[k] == "\\":
                backslashes += 1
                k -= 1
            pos = quote + 1
            if backslashes % 2 == 0:
                break


def _value(token: str) -> float:
    # float() also takes '1_000' and ' 1'; the exposition formats do not.
    if "_" in token:
        raise ValueError(token)
    return float(token)


def _timestamp_ms(token: str, openmetrics: bool) -> int:
    """Integer ms from a timestamp token; ValueError naming the problem if it is not a sane time."""
    if openmetrics:  # float seconds
        ms = _value(token) * 1000
    elif "." in token or "e" in token or "E" in token:
        ms = _value(token)  # lenient: some exporters write ms as a float
    elif "_" in token:  # int() takes '1_000'; the exposition formats do not
        raise ValueError(token)
    else:
        ms = int(token)
    # Compare before int(): int(inf) raises OverflowError, and 1e400 parses to inf.
    if not MIN_TIMESTAMP_MS <= ms <= MAX_TIMESTAMP_MS:
        raise ValueError("timestamp out of range (years 1 .. 9999 in ms; is it in the right unit?)")
    return int(round(ms)) if openmetrics else int(ms)


# One function on purpose: it is the scrape's hot loop, run once per line of every exposition, and
# splitting it into helpers would add a Python call per line; keep its branches inline.
def parse(text: str, *, openmetrics: bool | None = None, strict: bool = True,
          check_labels: bool = True, shape: Shape | None = None, keep_shape: bool = False) -> Parsed:
    """Parse one exposition into parallel lists; `*_created` samples are dropped.

    openmetrics=None detects the format (a final `# EOF`). Timestamps come back as integer ms
    (text format writes ms, OpenMetrics float seconds). strict=True raises ParseError on the
    first malformed line; strict=False skips it and records it in `errors`. check_labels
    validates each distinct label text once (cached across calls). `shape` (the last parse's
    `Parsed.shape`) reads a body of the same shape by its values alone; `keep_shape` records one.

    >>> p = parse('# TYPE a counter\\na_total{x="1"} 3\\na_created{x="1"} 1.7e9\\n')
    >>> p.names, p.labels, p.values, p.types
    (['a_total'], ['x="1"'], [3.0], {'a': 'counter'})
    """
    if openmetrics is None:
        openmetrics = looks_openmetrics(text)
    out = Parsed(openmetrics=openmetrics)
    names, labels, values, stamps = out.names, out.labels, out.values, out.timestamps_ms
    types = out.types
    heads = _valid_heads
    dropped = 0

    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if text[:1] in (" ", "\t") or "\n " in text or "\n\t" in text:
        lines = [line.strip() for line in lines]  # rare: indented lines
    if shape is not None and shape.openmetrics == openmetrics:
        replayed = _replay(shape, lines)
        if replayed is not None:
            return replayed
    add_name, add_labels, add_value, add_stamp = (
        names.append, labels.append, values.append, stamps.append)
    eof_index = -1
    keep_shape = keep_shape and check_labels
    sample_lines: list[int] = []
    created_lines: list[int] = []
    plain = True  # every sample line took the plain path (no timestamp, exemplar or odd spacing)

    for index, line in enumerate(lines):
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# TYPE "):
                parts = line.split(None, 3)
                if len(parts) < 4:
                    _fail(out, strict, index, line, "# TYPE needs a metric name and a type")
                    continue
                types[parts[2]] = parts[3].strip()
            elif openmetrics and line == "# EOF":
                eof_index = index
                break
            continue  # # HELP, # UNIT and other comments carry no samples

        # Fast path, nearly every line of a real scrape: 'name{labels} value' or 'name value'.
        # `head` ('name{labels}') repeats every scrape, so its split and validation are cached.
        head, _, last = line.rpartition(" ")
        known = heads.get(head)
        stamp = None
        if known is None and " " in head and not (openmetrics and "#" in line):
            # 'name{labels} value timestamp' (a dump) whose name{labels} is known: the value and time are new
            before, _, token = head.rpartition(" ")
            known = heads.get(before)
            if known is not None:
                try:
                    stamp = _timestamp_ms(last, openmetrics)
                    last = token
                except ValueError:
                    known, stamp = None, None  # the slow path names what is wrong
        if known is not None:
            name, label_text = known
        else:
            if head and head[-1] == "}" and not (openmetrics and "#" in line):
                brace = head.find("{")
                name = head[:brace]
                label_text = head[brace + 1:-1]
                cacheable = True
            elif head and " " not in head and "{" not in head and "\t" not in head:
                name = head
                label_text = ""
                cacheable = True
            else:
                plain = False
                parsed = _slow_line(out, strict, index, line, openmetrics)
                if parsed is None:
                    continue
                name, label_text, last, stamp = parsed
                # a plain 'name{labels} value timestamp' line: its name{labels} is cached as an untimed line's
                head = line.rpartition(" ")[0].rpartition(" ")[0]
                cacheable = stamp is not None and head == (f"{name}{{{label_text}}}" if label_text else name)
            if _METRIC_NAME.fullmatch(name) is None:
                _fail(out, strict, index, line, f"invalid metric name {name!r}")
                continue
            if label_text.isspace():  # 'a{ } 1' is a series without labels, as for promtool
                label_text = ""
            if label_text and check_labels:
                problem = _scan_labels(label_text)
                if problem is not None:
                    _fail(out, strict, index, line, problem)
                    continue
            if name.endswith(_CREATED):
                name = _CREATED
            if cacheable and check_labels:
                if len(heads) >= _HEAD_CACHE_MAX:
                    heads.clear()
                heads[head] = (name, label_text)
        try:
            value = float(last)
            if "_" in last:
                raise ValueError(last)
        except ValueError:
            _fail(out, strict, index, line, "value is not a number")
            continue
        if name is _CREATED:
            dropped += 1
            if keep_shape:
                created_lines.append(index)
            continue
        add_name(name)
        add_labels(label_text)
        add_value(value)
        add_stamp(stamp)
        if keep_shape:
            sample_lines.append(index)

    if eof_index >= 0:
        for index in range(eof_index + 1, len(lines)):
            if lines[index]:
                _fail(out, strict, index, lines[index], "content after # EOF")
    out.dropped_created = dropped
    if keep_shape and plain and not out.errors:
        out.shape = _shape_of(out, lines, sample_lines, created_lines)
    return out


def _shape_of(out: Parsed, lines: list[str], sample_lines: list[int], created_lines: list[int]) -> Shape:
    taken = set(sample_lines)
    taken.update(created_lines)
    verbatim = [i for i in range(len(lines)) if i not in taken]
    return Shape(heads=[line.rpartition(" ")[0] for line in lines], verbatim=verbatim,
                 texts=[lines[i] for i in verbatim], samples=sample_lines, created=created_lines,
                 names=list(out.names), labels=list(out.labels), types=dict(out.types),
                 openmetrics=out.openmetrics)


def _replay(shape: Shape, lines: list[str]) -> Parsed | None:
    """The body's samples by `shape`, or None when the body is not of that shape (parse it whole)."""
    if len(lines) != len(shape.heads):
        return None
    parts = [line.rpartition(" ") for line in lines]
    if [p[0] for p in parts] != shape.heads or [lines[i] for i in shape.verbatim] != shape.texts:
        return None
    tokens = [parts[i][2] for i in shape.samples]
    created = [parts[i][2] for i in shape.created]
    if "_" in "".join(tokens) or "_" in "".join(created):  # float() takes '1_000'; the formats do not
        return None
    try:
        values = list(map(float, tokens))
        for token in created:
            float(token)
    except ValueError:
        return None  # a malformed value: the whole parse names its line
    return Parsed(names=list(shape.names), labels=list(shape.labels), values=values,
                  timestamps_ms=[None] * len(values), types=dict(shape.types), openmetrics=shape.openmetrics,
                  dropped_created=len(shape.created), shape=shape)


def _slow_line(out: Parsed, strict: bool, index: int, line: str,
               openmetrics: bool) -> tuple[str, str, str, int | None] | None:
    """General case: timestamps, exemplars, odd spacing. Returns name, labels, value, ts."""
    brace = line.find("{")
    space = line.find(" ")
    if space == -1:
        space = line.find("\t")
    if brace == -1 or (space != -1 and space < brace):
        # No labels. An OpenMetrics exemplar may follow ' # '.
        body = line[: line.index(" # ")] if openmetrics and " # " in line else line
        parts = body.split()
        if not parts:
            _fail(out, strict, index, line, "expected 'name{labels} value [timestamp]'")
            return None
        name, label_text, rest = parts[0], "", parts[1:]
    else:
        name = line[:brace]
        if openmetrics:
            close = _label_end(line, brace + 1)
        else:
            # Nothing after the labels can hold '}' (no exemplars in text format),
            # so the last '}' closes them even when a label value contains one.
            close = line.rfind("}")
        if close == -1:
            _fail(out, strict, index, line, "labels are not closed with '}'")
            return None
        label_text = line[brace + 1:close]
        tail = line[close + 1:]
        if openmetrics and " # " in tail:
            tail = tail[: tail.index(" # ")]
        rest = tail.split()
    if not rest or len(rest) > 2:
        _fail(out, strict, index, line, "expected 'name{labels} value [timestamp]'")
        return None
    if len(rest) == 1:
        return name, label_text, rest[0], None
    try:
        return name, label_text, rest[0], _timestamp_ms(rest[1], openmetrics)
    except ValueError as e:
        reason = str(e) if str(e).startswith("timestamp") else "timestamp is not a number"
        _fail(out, strict, index, line, reason)
        return None


def _fail(out: Parsed, strict: bool, index: int, line: str, reason: str) -> None:
    error = ParseError(index + 1, line, reason)
    if strict:
        raise error
    out.errors.append(error)
