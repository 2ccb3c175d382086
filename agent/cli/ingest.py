"""`vllm-sentinel ingest`: import a Prometheus text or OpenMetrics dump into the store."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress

from vllm_sentinel.agent.cli.common import DbOption, Exit, db_path, err, fail, out
from vllm_sentinel.agent.store.db import Store, StoreError
from vllm_sentinel.agent.store.ingest import IngestError, ingest_file
from vllm_sentinel.collectors.timefmt import iso_seconds, parse_time_ms

app = typer.Typer(add_completion=False)


@app.command()
def ingest(file: Path = typer.Argument(..., help="Prometheus text or OpenMetrics dump"),
           instance: Optional[str] = typer.Option(None, help="instance label where the data has none"),
           at: Optional[str] = typer.Option(None, help="time of samples without a timestamp (default: file mtime)"),
           db: Optional[Path] = DbOption) -> None:
    """Import a metrics dump (with timestamps, or taken at --at) into the store."""
    try:
        at_ms = parse_time_ms(at) if at else None
    except ValueError as e:
        raise fail(str(e), Exit.USAGE) from None
    path = db_path(db)
    try:
        with Store.open(path) as store, Progress(console=err, transient=True) as bar:
            task = bar.add_task(f"ingesting {file.name}", total=None)
            result = ingest_file(store, file, instance, at_ms,
                                 progress=lambda done, total: bar.update(task, completed=done, total=total))
    except (IngestError, StoreError) as e:
        raise fail(str(e)) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # EOFError: a .gz cut short (click would say "Aborted.")
        why = "truncated (it ends before the gzip stream does)" if isinstance(e, EOFError) else f"not valid gzip ({e})"
        raise fail(f"{file} is {why}; copy the dump again, or gunzip it and ingest the text") from None
    except IsADirectoryError:
        raise fail(f"{file} is a directory; pass one dump file (ingest each file of the folder in turn)") from None
    except UnicodeDecodeError as e:
        raise fail(f"{file} is not text (byte {e.start}: {e.reason}); pass a Prometheus text or OpenMetrics dump, "
                   "plain or .gz") from None
    except OSError as e:
        raise fail(f"cannot read {file}: {e.strerror or e}; check the path and its permissions") from None
    span = (f"{iso_seconds(result.first_ms)} .. {iso_seconds(result.last_ms)}" if result.first_ms is not None
            else "no samples")
    out.print(f"stored {result.samples} samples for {', '.join(result.instances) or '-'} ({span}) in {path}",
              highlight=False)
    if result.skipped:  # stored, but not all of it: say so and exit non-zero
        raise fail(result.skipped_message() or "")
