"""`vllm-sentinel capture`: stacks of a vLLM server's processes now, stored by the daemon or into the file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vllm_sentinel.agent.cli.common import (DbOption, Exit, check_format, db_path, duration_s, err, fail, out,
                                            print_json)
from vllm_sentinel.agent.cli.source import daemon_or_file
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.diagnosis.captures import capture_and_store
from vllm_sentinel.agent.store.db import StoreError
from vllm_sentinel.reports.console import render_capture

app = typer.Typer(add_completion=False)


@app.command()
def capture(target: str = typer.Option(..., "--target", "-t", help="the vLLM server URL whose processes to sample"),
            record: Optional[int] = typer.Option(None, "--record", help="sample for this many seconds instead of one dump"),
            vllm_profiler: str = typer.Option("", "--vllm-profiler", help="then run vLLM's own profiler this long, e.g. 3s (torch traces, or nsys under `nsys launch`; slows serving while it runs)"),
            db: Optional[Path] = DbOption,
            fmt: str = typer.Option("table", "--format", help="table or json")) -> None:
    """Stacks of the vLLM processes now (py-spy --nonblocking: the server is never paused)."""
    check_format(fmt, ("table", "json"))
    if record is not None and not 0 < record <= 3600:
        raise fail(f"--record {record}: give the seconds to sample, from 1 to 3600 (or leave it out for one dump)",
                   Exit.USAGE)
    kind, seconds = ("record", record) if record else ("dump", 3)
    profiler_s = duration_s(vllm_profiler, "--vllm-profiler") if vllm_profiler else None
    path = db_path(db)
    query = {"target": target, "kind": kind, "duration_s": seconds, "profiler_s": profiler_s}
    wait_s = seconds + 60 + (profiler_s + 300 if profiler_s else 0)  # vLLM may take minutes to write traces
    try:  # a daemon beside vLLM captures and stores it with its incidents; else this process stores it
        answer = daemon_or_file(path, "/v1/capture", query, timeout=wait_s, read_only=False,
                                on_file=lambda store: capture_and_store(store, target, kind, seconds, profiler_s))
        doc = answer.daemon if answer.daemon is not None else answer.file
        doc["stored_in"] = f"daemon:{path}" if answer.daemon is not None else str(path)
    except ApiError as e:
        raise fail(str(e)) from None
    except StoreError as e:
        err.print(f"[yellow]not stored:[/] {e}", highlight=False)
        doc = capture_and_store(None, target, kind, seconds, profiler_s)
    if fmt == "json":
        print_json(doc)
    else:
        render_capture(out, doc)
    if doc["status"] not in ("ok", "truncated"):
        raise fail(doc.get("error") or doc["status"])
