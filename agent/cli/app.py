"""The `vllm-sentinel` command line: parse options, call one library function, render, map errors to exits."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from vllm_sentinel.agent.daemon import api
from vllm_sentinel.agent.daemon.paths import default_db_path, socket_path_for
from vllm_sentinel.collectors.timefmt import parse_duration_ms, parse_time_ms

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Observability and incident diagnosis for vLLM: metrics, GPU counters and stacks on one timeline.")
out = Console()
err = Console(stderr=True, soft_wrap=True)  # error lines stay whole for grep and logs

DbOption = typer.Option(None, "--db", help="DuckDB file (default: $VLLM_SENTINEL_DB, else the per-user data dir)")


class Exit:
    """Exit codes: 0 ok, 1 domain problem (no data, locked, bad input), 2 usage."""

    OK, PROBLEM, USAGE = 0, 1, 2


def fail(message: str, code: int = Exit.PROBLEM) -> typer.Exit:
    """Print one clear line to stderr and return the exit to raise."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def _db(db: Optional[Path]) -> Path:
    return db if db is not None else default_db_path()


def _window(since: str, until: Optional[str]) -> tuple[int, int]:
    try:
        end = parse_time_ms(until) if until else int(time.time() * 1000)
        return end - parse_duration_ms(since), end
    except ValueError as e:
        raise fail(str(e), Exit.USAGE) from None


@app.command()
def run(target: list[str] = typer.Option(..., "--target", "-t", help="vLLM server URL (repeatable), e.g. http://127.0.0.1:8000"),
        db: Optional[Path] = DbOption,
        interval: str = typer.Option("1s", help="collection interval"),
        scrape_timeout: str = typer.Option("", help="per-scrape timeout (default: the interval, at least 3s, at most 10s)"),
        scrape_max_bytes: int = typer.Option(32 * 2**20, help="largest /metrics answer read, in bytes"),
        retention: str = typer.Option("7d", help="keep this much history; older hours are dropped whole"),
        metrics_port: int = typer.Option(9464, help="own /metrics on 127.0.0.1 (0: off)"),
        nvml: str = typer.Option("auto", help="GPU counters via NVML: auto (when nvidia-ml-py is installed), on, off"),
        rules: Optional[list[Path]] = typer.Option(None, "--rules", help="rule file or folder (repeatable; default: the shipped pack)"),
        params: Optional[Path] = typer.Option(None, "--params", help="YAML file overriding rule thresholds (name: value)"),
        eval_interval: str = typer.Option("5s", help="rule evaluation interval"),
        reports_dir: Optional[Path] = typer.Option(None, help="incident reports go here (default: <db>.reports/)"),
        alertmanager: Optional[list[str]] = typer.Option(None, "--alertmanager", help="send incidents as alerts to this Alertmanager, e.g. http://127.0.0.1:9093 (repeatable)"),
        vllm_profiler: str = typer.Option("", "--vllm-profiler", help="also run vLLM's own profiler (torch, or nsys under `nsys launch`) this long, e.g. 3s, when a stack-explained incident opens; it slows serving, so at most once per target per 10 min (default: off)"),
        duration: str = typer.Option("", help="stop after this long (default: until SIGTERM/SIGINT)"),
        verbose: bool = typer.Option(False, "-v", help="log to stderr")) -> None:
    """The sidecar daemon: scrape, store, evaluate, serve the local API."""
    from vllm_sentinel.agent.daemon.wiring import DaemonOptions, build_sidecar, default_scrape_timeout_s
    from vllm_sentinel.agent.store.db import StoreError

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        interval_s = parse_duration_ms(interval) / 1000
        options = DaemonOptions(
            targets=target, db=_db(db), interval_s=interval_s,
            scrape_timeout_s=(parse_duration_ms(scrape_timeout) / 1000) if scrape_timeout
            else default_scrape_timeout_s(interval_s),
            retention_ms=parse_duration_ms(retention), metrics_port=metrics_port or None, nvml=nvml,
            scrape_max_bytes=scrape_max_bytes, rules=rules or None,
            eval_interval_s=parse_duration_ms(eval_interval) / 1000, reports_dir=reports_dir, params=params,
            vllm_profiler_s=parse_duration_ms(vllm_profiler) / 1000 if vllm_profiler else None,
            alertmanagers=list(alertmanager or []))
        stop_after = parse_duration_ms(duration) / 1000 if duration else None
    except ValueError as e:
        raise fail(str(e), Exit.USAGE) from None
    try:
        sidecar = build_sidecar(options)
    except (StoreError, api.ApiError, ValueError, OSError) as e:  # RuleFileError is a ValueError
        raise fail(str(e)) from None
    err.print(f"vllm-sentinel: watching {', '.join(options.targets)} every {interval_s:g}s -> {options.db} "
              f"(API {socket_path_for(options.db)}"
              + (f", /metrics on 127.0.0.1:{metrics_port})" if metrics_port else ")"), highlight=False)
    try:
        sidecar.run_forever(stop_after)
    finally:
        sidecar.store.close()


@app.command()
def diagnose(since: str = typer.Option("1h", help="window length, ending at --until"),
             until: Optional[str] = typer.Option(None, help="window end: RFC 3339 or Unix seconds (default: now)"),
             instance: Optional[str] = typer.Option(None, help="only this instance"),
             fmt: str = typer.Option("table", "--format", help="table, markdown or json"),
             rules: Optional[list[Path]] = typer.Option(None, "--rules", help="rule file or folder (repeatable; default: the shipped pack)"),
             params: Optional[Path] = typer.Option(None, "--params", help="YAML file overriding rule thresholds (name: value)"),
             db: Optional[Path] = DbOption) -> None:
    """Incidents with evidence and fixes, and a health summary, over a window of history."""
    from vllm_sentinel.agent.daemon.routes import diagnose_via_best_source
    from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow
    from vllm_sentinel.agent.alerts.rulefile import RuleFileError
    from vllm_sentinel.agent.alerts.rulepack import load_pack
    from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
    from vllm_sentinel.agent.store.db import StoreError
    from vllm_sentinel.reports.console import render_diagnosis

    if fmt not in ("table", "markdown", "json"):
        raise fail(f"--format {fmt!r}: use table, markdown or json", Exit.USAGE)
    start, end = _window(since, until)
    try:
        pack = load_pack(rules, params)
    except (RuleFileError, OSError) as e:
        raise fail(str(e)) from None
    try:
        # a long window or a large fleet takes seconds: say what is happening (on stderr, so JSON stays clean)
        with err.status(f"evaluating {len(pack)} rule file(s) over {since} of history"):
            doc = diagnose_via_best_source(_db(db), start, end, instance, pack_window_evaluator(pack), rules,
                                           markdown=fmt == "markdown", params=params)
    except NoDataInWindow as e:
        raise fail(str(e)) from None
    except (StoreError, api.ApiError) as e:
        raise fail(str(e)) from None
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(doc["markdown"])
    else:
        render_diagnosis(out, doc, fmt)


@app.command()
def ingest(file: Path = typer.Argument(..., help="Prometheus text or OpenMetrics dump"),
           instance: Optional[str] = typer.Option(None, help="instance label where the data has none"),
           at: Optional[str] = typer.Option(None, help="time of samples without a timestamp (default: file mtime)"),
           db: Optional[Path] = DbOption) -> None:
    """Import a metrics dump (with timestamps, or taken at --at) into the store."""
    from rich.progress import Progress

    from vllm_sentinel.agent.diagnosis.diagnose import iso
    from vllm_sentinel.agent.store.ingest import IngestError, ingest_file
    from vllm_sentinel.agent.store.db import Store, StoreError

    try:
        at_ms = parse_time_ms(at) if at else None
    except ValueError as e:
        raise fail(str(e), Exit.USAGE) from None
    try:
        with Store.open(_db(db)) as store, Progress(console=err, transient=True) as bar:
            task = bar.add_task(f"ingesting {file.name}", total=None)
            result = ingest_file(store, file, instance, at_ms,
                                 progress=lambda done, total: bar.update(task, completed=done, total=total))
    except (IngestError, StoreError) as e:
        raise fail(str(e)) from None
    span = f"{iso(result.first_ms)} .. {iso(result.last_ms)}" if result.first_ms is not None else "no samples"
    out.print(f"stored {result.samples} samples for {', '.join(result.instances) or '-'} ({span}) in {_db(db)}",
              highlight=False)


@app.command()
def status(db: Optional[Path] = DbOption, fmt: str = typer.Option("table", "--format", help="table or json")) -> None:
    """The daemon's targets and collectors, and their health (enabled, failing, why)."""
    from vllm_sentinel.agent.daemon.routes import status_via_daemon
    from vllm_sentinel.reports.console import render_status

    try:
        doc = status_via_daemon(_db(db))
    except api.DaemonNotRunning:
        raise fail(f"no daemon is running for {_db(db)} (socket {socket_path_for(_db(db))}). "
                   "Start one with `vllm-sentinel run --target URL`.") from None
    except api.ApiError as e:
        raise fail(str(e)) from None
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        render_status(out, doc)


@app.command()
def capture(target: str = typer.Option(..., "--target", "-t", help="the vLLM server URL whose processes to sample"),
            record: Optional[int] = typer.Option(None, "--record", help="sample for this many seconds instead of one dump"),
            vllm_profiler: str = typer.Option("", "--vllm-profiler", help="then run vLLM's own profiler this long, e.g. 3s (torch traces, or nsys under `nsys launch`; slows serving while it runs)"),
            db: Optional[Path] = DbOption,
            fmt: str = typer.Option("table", "--format", help="table or json")) -> None:
    """Stacks of the vLLM processes now (py-spy --nonblocking: the server is never paused)."""
    from vllm_sentinel.agent.diagnosis.captures import capture_and_store
    from vllm_sentinel.agent.store.db import Store, StoreError
    from vllm_sentinel.reports.console import render_capture

    kind, seconds = ("record", record) if record else ("dump", 3)
    try:
        profiler_s = parse_duration_ms(vllm_profiler) / 1000 if vllm_profiler else None
    except ValueError as e:
        raise fail(f"--vllm-profiler: {e}", Exit.USAGE) from None
    params = {"target": target, "kind": kind, "duration_s": seconds, "profiler_s": profiler_s}
    try:  # a daemon beside vLLM captures and stores it with its incidents
        wait_s = seconds + 60 + (profiler_s + 300 if profiler_s else 0)  # vLLM may take minutes to write traces
        doc = api.call(socket_path_for(_db(db)), "/v1/capture", params, timeout=wait_s)
        doc["stored_in"] = f"daemon:{_db(db)}"
    except api.DaemonNotRunning:
        doc = None
    except api.ApiError as e:
        raise fail(str(e)) from None
    if doc is None:
        try:
            with Store.open(_db(db)) as store:
                doc = capture_and_store(store, target, kind, seconds, profiler_s)
                doc["stored_in"] = str(_db(db))
        except StoreError as e:
            err.print(f"[yellow]not stored:[/] {e}", highlight=False)
            doc = capture_and_store(None, target, kind, seconds, profiler_s)
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        render_capture(out, doc)
    if doc["status"] not in ("ok", "truncated"):
        raise fail(doc.get("error") or doc["status"])


@app.command()
def demo(replay: bool = typer.Option(False, "--replay", help="seconds, no server: the same pipeline on a recorded real session"),
         seconds: Optional[int] = typer.Option(None, help="hold each incident this long (default: long enough for the rules' `for`)"),
         workdir: Optional[Path] = typer.Option(None, help="where databases, logs and reports go (default: ./vllm-sentinel-demo)")) -> None:
    """The embedded default: a real vLLM CPU server, traffic that causes incidents, the sidecar, a diagnosis."""
    from vllm_sentinel.agent.demo.live import DemoError, run_demo, run_replay_demo
    from vllm_sentinel.reports.console import render_diagnosis

    say = lambda m: err.print(f"[cyan]==>[/] {m}", highlight=False)  # noqa: E731
    try:
        doc = run_replay_demo(workdir, say) if replay else run_demo(seconds, workdir, say)
    except DemoError as e:
        raise fail(str(e)) from None
    render_diagnosis(out, doc, "table")
    out.print(f"\nDatabase: {doc['database']}  (vllm-sentinel diagnose --db {doc['database']} --since 1h"
              f"{' --until ' + doc['window']['end'] if replay else ''})", highlight=False)
    for path in doc.get("reports", []):
        out.print(f"Report: {path}", highlight=False)


def _mount_command_modules() -> None:
    # commands owned by modules of their own (thin typer apps), mounted here
    from vllm_sentinel.agent.cli import plan as cli_plan
    from vllm_sentinel.agent.cli import report as cli_report
    from vllm_sentinel.agent.cli import rules as cli_rules

    app.add_typer(cli_rules.app, name="rules")
    for module in (cli_plan, cli_report):
        for command in module.app.registered_commands:
            app.registered_commands.append(command)


_mount_command_modules()


def main() -> None:
    """Console-script entry point."""
    app()
