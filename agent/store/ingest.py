"""`ingest`: import a Prometheus text / OpenMetrics dump (with or without timestamps) into the store."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vllm_sentinel.agent.store import coverage_table, rollups
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.sample_checks import MAX_TS_MS, Rejected
from vllm_sentinel.collectors.aliases import resolve
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.collectors.dump_columns import TimedColumns, plain_enough, timed_columns
from vllm_sentinel.collectors.exposition import looks_openmetrics, parse, parse_labels

CHUNK_LINES = 200_000  # bounded memory for large dumps: parse and commit this many lines at a time
CHUNK_BYTES = 24 << 20  # the same for the columnar path: about 170 k lines of a vLLM dump with timestamps


class IngestError(Exception):
    """The dump cannot be imported as it is; the message names the line and the fix."""


@dataclass
class IngestResult:
    """What an ingest stored."""

    samples: int
    instances: list[str]
    first_ms: int | None
    last_ms: int | None
    skipped: int = 0  # malformed lines left out (each named by `first_skipped` for the first)
    first_skipped: str | None = None  # 'line 17: timestamp out of range ...: <line>'

    def skipped_message(self) -> str | None:
        """One line naming the skipped lines and the fix, or None when every line was stored."""
        if not self.skipped:
            return None
        return (f"skipped {self.skipped} malformed line(s), first {self.first_skipped}; the other "
                "samples are stored: fix those lines and ingest just them (ingesting the whole file "
                "again would store its samples twice)")


def ingest_text(store: Store, text: str, instance: str | None, default_ts_ms: int,
                progress: Callable[[int, int], None] | None = None) -> IngestResult:
    """Parse `text` and store every well-formed sample; samples without a timestamp get `default_ts_ms`.

    The `instance` label in the data wins; `instance` fills it where the data has none. Malformed
    lines (bad syntax, a timestamp outside years 1..9999) and samples the store cannot hold (a time
    before 1970 or after 2262) are left out and counted in the result, as a scrape does: one bad
    line must not cost the rest of someone's dump.
    """
    if text.isascii():
        data = text.encode("ascii")
        if plain_enough(data):
            return _ingest_columns(store, data, instance, default_ts_ms, progress)
    return _ingest_lines(store, text, instance, default_ts_ms, progress)


def ingest_bytes(store: Store, data: bytes, instance: str | None, default_ts_ms: int,
                 progress: Callable[[int, int], None] | None = None) -> IngestResult:
    """`ingest_text` of UTF-8 bytes (UnicodeDecodeError when they are not): a plain ASCII dump is read as
    columns without ever becoming one large str."""
    if plain_enough(data):
        return _ingest_columns(store, data, instance, default_ts_ms, progress)
    return _ingest_lines(store, data.decode("utf-8"), instance, default_ts_ms, progress)


class _Tally:
    """What the chunks stored so far: counts, instances, the time span and the first skipped line."""

    def __init__(self, store: Store) -> None:
        self.store, self.stored, self.skipped = store, 0, 0
        self.first_skipped: str | None = None
        self.seen: set[str] = set()
        self.first: int | None = None
        self.last: int | None = None
        self.rolled_before = store._rolled_until

    def span(self, lo: int, hi: int) -> None:
        """Widen the stored time span."""
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = hi if self.last is None else max(self.last, hi)

    def store_lines(self, text: str, openmetrics: bool, instance: str | None, default_ts_ms: int,
                    line_of: Callable[[int], int]) -> None:
        """Parse lines and store their samples; `line_of` turns parse's line number into the dump's."""
        parsed = parse(text + "# EOF\n" if openmetrics else text, openmetrics=openmetrics, strict=False)
        if parsed.errors:
            self.skipped += len(parsed.errors)
            if self.first_skipped is None:
                e = parsed.errors[0]
                self.first_skipped = f"line {line_of(e.line_no)}: {e.reason}: {e.line[:120]!r}"
        batches = _batches(parsed, instance, default_ts_ms)
        for b in batches.values():
            self.seen.add(b.instance)
            stamps = [default_ts_ms if t is None else t for t in b.timestamps_ms]
            if stamps:
                self.span(min(stamps), max(stamps))
        refused: list[Rejected] = []  # times the store cannot hold (before 1970, after 2262): skipped too
        self.stored += self.store.append_many(batches.values(), refused)
        for r in refused:
            self.skipped += r.count
            if self.first_skipped is None:
                self.first_skipped = r.example

    def result(self) -> IngestResult:
        """The result; what a daemon evaluated live before the dump came in did not see it (diagnose replays
        from its first sample), and its blocks, with any the store had rolled before, are rolled up."""
        if self.first is not None:
            coverage_table.clip(self.store, self.first)
            rollups.roll_up_all(self.store, max(self.rolled_before, self.last + 1))
        return IngestResult(self.stored, sorted(self.seen), self.first, self.last, self.skipped, self.first_skipped)


def _ingest_lines(store: Store, text: str, instance: str | None, default_ts_ms: int,
                  progress: Callable[[int, int], None] | None) -> IngestResult:
    """`ingest_text` line by line through `parse`: any text, CHUNK_LINES lines at a time."""
    openmetrics = looks_openmetrics(text)
    lines = text.splitlines(keepends=True)
    if openmetrics:  # one chunk must not end in the middle: drop the single trailing # EOF ourselves
        while lines and not lines[-1].strip():
            lines.pop()
        if lines and lines[-1].strip() == "# EOF":
            lines.pop()
    tally = _Tally(store)
    total = len(lines)
    for start in range(0, max(total, 1), CHUNK_LINES):
        tally.store_lines("".join(lines[start:start + CHUNK_LINES]), openmetrics, instance, default_ts_ms,
                          lambda n, start=start: start + n)
        if progress:
            progress(min(start + CHUNK_LINES, total), total)
    return tally.result()


def _openmetrics(data: bytes) -> bool:
    """`looks_openmetrics` of an ASCII dump, reading its end only."""
    tail = data[-65536:].rstrip()
    if not tail and len(data) > 65536:
        tail = data.rstrip()[-65536:]  # a dump that ends in 64 KiB of blanks: rare, read it all
    # as looks_openmetrics: a last line '# EOF', or nothing but '# EOF' (the rare second case copies the dump)
    return tail.endswith(b"\n# EOF") or (tail.endswith(b"# EOF") and not data.rstrip()[:-5].strip())


def _without_eof(data: bytes) -> bytes:
    """The dump without the blank lines and the single `# EOF` that end an OpenMetrics dump."""
    cut = data.find(b"\n", len(data.rstrip()))
    body = data if cut == -1 else data[:cut + 1]
    last_start = body.rfind(b"\n", 0, len(body) - 1) + 1
    return body[:last_start] if body[last_start:].strip() == b"# EOF" else body


def _ingest_columns(store: Store, data: bytes, instance: str | None, default_ts_ms: int,
                    progress: Callable[[int, int], None] | None) -> IngestResult:
    """`ingest_text` of an ASCII dump without stray control characters: its plain timed lines as columns (a
    lookup per line), every other line through `parse` by its line number, so each is stored or named as
    before. Progress is counted in bytes."""
    openmetrics = _openmetrics(data)
    if openmetrics:
        data = _without_eof(data)
    tally = _Tally(store)
    heads: dict[bytes, tuple[str, str] | None] = {}  # 'name{labels}' -> as parse reads it; None: parse's to read
    pos = line_base = 0
    while pos < len(data):
        end = data.find(b"\n", pos + CHUNK_BYTES)
        end = len(data) if end == -1 else end + 1
        piece = data[pos:end]
        pos = end
        cols = timed_columns(piece, openmetrics, MAX_TS_MS)
        if cols.indented:  # parse strips every line of such a text: it reads this chunk, as it did before
            tally.store_lines(piece.decode("ascii"), openmetrics, instance, default_ts_ms,
                              lambda n, base=line_base: base + n)
        else:
            _store_chunk(tally, piece, cols, heads, openmetrics, instance, line_base, default_ts_ms)
        line_base += len(cols.ends)
        if progress:
            progress(pos, len(data))
    return tally.result()


def _as_parse_reads(head: bytes, openmetrics: bool) -> tuple[str, str] | None:
    """(name, label text) of a 'name{labels}' that `parse` reads as written; ('', '') for a well-formed
    *_created one (parse drops its samples); None for one it would refuse or read otherwise (those lines
    go through parse, which names the problem)."""
    text = head.decode("ascii")
    brace = text.find("{")
    name_part = text if brace == -1 else text[:brace]
    created = name_part.endswith("_created")
    probe = name_part + "x" + text[len(name_part):] if created else text  # parse keeps what it would drop
    p = parse(probe + " 0\n" + ("# EOF\n" if openmetrics else ""), openmetrics=openmetrics, strict=False)
    if p.errors or len(p.names) != 1 or p.timestamps_ms != [None]:
        return None
    name, labels = p.names[0], p.labels[0]
    if probe != (f"{name}{{{labels}}}" if labels else name):
        return None
    return ("", "") if created else (name, labels)


def _store_chunk(tally: _Tally, piece: bytes, cols: TimedColumns, heads: dict[bytes, tuple[str, str] | None],
                 openmetrics: bool, instance: str | None, line_base: int, default_ts_ms: int) -> None:
    """Store one chunk's plain lines as columns and its other lines as `parse` reads them."""
    slow_heads: list[int] = []
    kept: list[tuple[int, str, str]] = []  # (head index, name, label text) of the heads read as parse reads them
    for i, head in enumerate(cols.heads):
        read = heads.get(head, False)
        if read is False:
            read = heads[head] = _as_parse_reads(head, openmetrics)
        if read is None:
            slow_heads.append(i)
        elif read[0]:
            kept.append((i, *read))
    canonical, renames = resolve([name for _, name, _ in kept])
    sources = {c: src for src, c in renames.items()}
    series: list[tuple[str, str, str, str]] = []
    of_head = np.full(len(cols.heads), -1, dtype=np.int64)
    for (i, _name, labels), metric in zip(kept, canonical):
        inst = parse_labels(labels).get("instance") if 'instance="' in labels else None
        inst = inst or instance
        if not inst:
            raise IngestError(f"{metric}{{{labels}}} has no instance label; pass --instance HOST:PORT to name "
                              "the server this dump came from")
        of_head[i] = len(series)
        series.append((inst, metric, labels, sources.get(metric, metric)))
        tally.seen.add(inst)
    slow = np.zeros(len(cols.heads), dtype=bool)
    slow[slow_heads] = True
    line_series = of_head[cols.codes]
    take = line_series >= 0
    if take.any():
        ts = cols.stamps_ms[take]
        tally.stored += tally.store.append_columns(series, line_series[take], ts, cols.values[take])
        tally.span(int(ts.min()), int(ts.max()))
    others = np.union1d(cols.other_lines, cols.lines[slow[cols.codes]]) if slow_heads else cols.other_lines
    if len(others):
        tally.store_lines("".join(cols.line_text(piece, int(n)) + "\n" for n in others), openmetrics, instance,
                          default_ts_ms, lambda n: line_base + int(others[n - 1]) + 1)


def ingest_file(store: Store, path: str | Path, instance: str | None = None, default_ts_ms: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> IngestResult:
    """Ingest a file; samples without timestamps default to the file's modification time."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rb") as f:
                data = f.read()
        else:
            data = p.read_bytes()
        if not data.isascii():
            data.decode("utf-8")  # the byte that is not UTF-8 is named below
    except gzip.BadGzipFile as e:
        raise IngestError(f"{p} ends in .gz but is not gzip ({e}); rename or recompress it") from None
    except FileNotFoundError:
        raise IngestError(f"{p} does not exist") from None
    except UnicodeDecodeError as e:
        raise IngestError(f"{p} is not UTF-8 text (byte {e.start}); is it compressed? Decompress it first.") from e
    if default_ts_ms is None:
        default_ts_ms = int(p.stat().st_mtime * 1000)
    return ingest_bytes(store, data, instance, default_ts_ms, progress)


def _batches(parsed, instance: str | None, default_ts_ms: int) -> dict[str, Batch]:
    metrics, renames = resolve(parsed.names)
    sources = {canonical: source for source, canonical in renames.items()}
    out: dict[str, Batch] = {}
    label_instance: dict[str, str | None] = {}  # label text -> its instance label (parsed once per text)
    for metric, text, value, ts in zip(metrics, parsed.labels, parsed.values, parsed.timestamps_ms):
        inst = label_instance.get(text, "")
        if inst == "":
            inst = parse_labels(text).get("instance") if 'instance="' in text else None
            label_instance[text] = inst
        inst = inst or instance
        if not inst:
            raise IngestError(f"{metric}{{{text}}} has no instance label; pass --instance HOST:PORT to name "
                              "the server this dump came from")
        b = out.get(inst)
        if b is None:
            b = out[inst] = Batch(instance=inst, ts_ms=default_ts_ms, sources=sources)
        b.metrics.append(metric)
        b.labels.append(text)
        b.values.append(value)
        b.timestamps_ms.append(ts)
    return out
