"""`ingest`: import a Prometheus text / OpenMetrics dump (with or without timestamps) into the store."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.aliases import resolve
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.collectors.exposition import ParseError, looks_openmetrics, parse, parse_labels

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


def ingest_text(store: Store, text: str, instance: str | None, default_ts_ms: int,
                progress: Callable[[int, int], None] | None = None) -> IngestResult:
    """Parse `text` strictly and store it; samples without a timestamp get `default_ts_ms`.

    The `instance` label in the data wins; `instance` fills it where the data has none.
    """
    openmetrics = looks_openmetrics(text)
    lines = text.splitlines(keepends=True)
    if openmetrics:  # one chunk must not end in the middle: drop the single trailing # EOF ourselves
        while lines and not lines[-1].strip():
            lines.pop()
        if lines and lines[-1].strip() == "# EOF":
            lines.pop()
    total, stored = len(lines), 0
    seen: set[str] = set()
    first = last = None
    for start in range(0, max(total, 1), CHUNK_LINES):
        chunk = "".join(lines[start:start + CHUNK_LINES])
        try:
            parsed = parse(chunk + "# EOF\n" if openmetrics else chunk, openmetrics=openmetrics, strict=True)
        except ParseError as e:
            raise IngestError(f"line {start + e.line_no}: {e.reason}: {e.line[:120]!r}. Fix or delete that "
                              "line and ingest again; nothing from this chunk was stored.") from e
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
    return IngestResult(stored, sorted(seen), first, last)


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
