"""`ingest`: import a Prometheus text / OpenMetrics dump (with or without timestamps) into the store."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_sentinel.agent.store import coverage_table, rollups
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.aliases import resolve
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.collectors.exposition import looks_openmetrics, parse, parse_labels

CHUNK_LINES = 200_000  # bounded memory for large dumps: parse and commit this many lines at a time


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
    lines (bad syntax, a timestamp outside years 1..9999) are left out and counted in the result,
    as a scrape does: one bad line must not cost the rest of someone's dump.
    """
    openmetrics = looks_openmetrics(text)
    lines = text.splitlines(keepends=True)
    if openmetrics:  # one chunk must not end in the middle: drop the single trailing # EOF ourselves
        while lines and not lines[-1].strip():
            lines.pop()
        if lines and lines[-1].strip() == "# EOF":
            lines.pop()
    total, stored, skipped = len(lines), 0, 0
    first_skipped: str | None = None
    seen: set[str] = set()
    first = last = None
    rolled_before = store._rolled_until
    for start in range(0, max(total, 1), CHUNK_LINES):
        chunk = "".join(lines[start:start + CHUNK_LINES])
        parsed = parse(chunk + "# EOF\n" if openmetrics else chunk, openmetrics=openmetrics, strict=False)
        if parsed.errors:
            skipped += len(parsed.errors)
            if first_skipped is None:
                e = parsed.errors[0]
                first_skipped = f"line {start + e.line_no}: {e.reason}: {e.line[:120]!r}"
        batches = _batches(parsed, instance, default_ts_ms, start)
        for b in batches.values():
            seen.add(b.instance)
            stamps = [default_ts_ms if t is None else t for t in b.timestamps_ms]
            if stamps:
                first = min(stamps) if first is None else min(first, min(stamps))
                last = max(stamps) if last is None else max(last, max(stamps))
        stored += store.append_many(batches.values())
        if progress:
            progress(min(start + CHUNK_LINES, total), total)
    if first is not None:
        # what a daemon evaluated live before this dump came in did not see it: diagnose replays from here
        coverage_table.clip(store, first)
        # the dump's blocks rolled up for long windows, and any the store had rolled before it came in
        rollups.roll_up_all(store, max(rolled_before, last + 1))
    return IngestResult(stored, sorted(seen), first, last, skipped, first_skipped)


def ingest_file(store: Store, path: str | Path, instance: str | None = None, default_ts_ms: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> IngestResult:
    """Ingest a file; samples without timestamps default to the file's modification time."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8") as f:
                text = f.read()
        else:
            text = p.read_text(encoding="utf-8")
    except gzip.BadGzipFile as e:
        raise IngestError(f"{p} ends in .gz but is not gzip ({e}); rename or recompress it") from None
    except FileNotFoundError:
        raise IngestError(f"{p} does not exist") from None
    except UnicodeDecodeError as e:
        raise IngestError(f"{p} is not UTF-8 text (byte {e.start}); is it compressed? Decompress it first.") from e
    if default_ts_ms is None:
        default_ts_ms = int(p.stat().st_mtime * 1000)
    return ingest_text(store, text, instance, default_ts_ms, progress)


def _batches(parsed, instance: str | None, default_ts_ms: int, line_offset: int) -> dict[str, Batch]:
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
