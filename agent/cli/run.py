"""`vllm-sentinel run`: the sidecar daemon, wired from its options and run until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

import typer

from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.cli.common import (DbOption, Exit, ParamsOption, RulesOption, db_path, duration_ms,
                                            duration_s, err, fail)
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.daemon.cpu_budget import parse_budget
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.agent.daemon.wiring import DaemonOptions, build_sidecar, default_scrape_timeout_s
from vllm_sentinel.agent.store.db import StoreError

app = typer.Typer(add_completion=False)


@app.command()
def run(target: list[str] = typer.Option(..., "--target", "-t", help="vLLM server URL (repeatable), e.g. http://127.0.0.1:8000"),
        db: Optional[Path] = DbOption,
        interval: str = typer.Option("1s", help="collection interval"),
        scrape_timeout: str = typer.Option("", help="per-scrape timeout (default: the interval, at least 3s, at most 10s)"),
        scrape_max_bytes: int = typer.Option(32 * 2**20, help="largest /metrics answer read, in bytes"),
        retention: str = typer.Option("7d", help="keep this much history; older hours are dropped whole"),
        metrics_port: int = typer.Option(9464, help="own /metrics on 127.0.0.1 (0: off)"),
        nvml: str = typer.Option("auto", help="GPU counters via NVML: auto (when nvidia-ml-py is installed), on, off"),
        rules: Optional[list[Path]] = RulesOption,
        params: Optional[Path] = ParamsOption,
        eval_interval: str = typer.Option("5s", help="rule evaluation interval"),
        reports_dir: Optional[Path] = typer.Option(None, help="incident reports go here (default: <db>.reports/)"),
        alertmanager: Optional[list[str]] = typer.Option(None, "--alertmanager", help="send incidents as alerts to this Alertmanager, e.g. http://127.0.0.1:9093 (repeatable)"),
        vllm_profiler: str = typer.Option("", "--vllm-profiler", help="also run vLLM's own profiler (torch, or nsys under `nsys launch`) this long, e.g. 3s, when a stack-explained incident opens; it slows serving, so at most once per target per 10 min (default: off)"),
        cpu_budget: str = typer.Option("10%", "--cpu-budget", help="the daemon's CPU, as a share of one core (e.g. 5% or 0.05): above it, stack captures, profiler runs and reports wait, and on a saturated host the interval stretches (up to 8x)"),
        duration: str = typer.Option("", help="stop after this long (default: until SIGTERM/SIGINT)"),
        verbose: bool = typer.Option(False, "-v", help="log to stderr")) -> None:
    """The sidecar daemon: scrape, store, evaluate, serve the local API."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    interval_s = duration_s(interval, "--interval")
    _check_run_inputs(target, scrape_max_bytes)
    try:
        budget = parse_budget(cpu_budget)
    except ValueError as e:
        raise fail(str(e)) from None
    options = DaemonOptions(
        targets=target, db=db_path(db), interval_s=interval_s,
        scrape_timeout_s=duration_s(scrape_timeout, "--scrape-timeout") if scrape_timeout else default_scrape_timeout_s(interval_s),
        retention_ms=duration_ms(retention, "--retention"), metrics_port=metrics_port or None, nvml=nvml,
        scrape_max_bytes=scrape_max_bytes, rules=rules or None,
        eval_interval_s=duration_s(eval_interval, "--eval-interval"), reports_dir=reports_dir, params=params,
        vllm_profiler_s=duration_s(vllm_profiler, "--vllm-profiler") if vllm_profiler else None,
        alertmanagers=list(alertmanager or []), cpu_budget=budget)
    stop_after = duration_s(duration, "--duration") if duration else None
    try:
        sidecar = build_sidecar(options)
    except (StoreError, ApiError, RuleFileError, ValueError, OSError) as e:
        raise fail(str(e)) from None
    err.print(f"vllm-sentinel: watching {', '.join(options.targets)} every {interval_s:g}s -> {options.db} "
              f"(API {socket_path_for(options.db)}"
              + (f", /metrics on 127.0.0.1:{metrics_port})" if metrics_port else ")"), highlight=False)
    try:
        sidecar.run_forever(stop_after)
    finally:
        sidecar.store.close()


def _check_run_inputs(targets: list[str], scrape_max_bytes: int) -> None:
    """Refuse a target that is not an http(s) URL, or a non-positive --scrape-max-bytes (exit 2)."""
    for t in targets:
        url = urlparse(t)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise fail(f"--target {t!r} is not an http(s) URL; pass the vLLM server, e.g. --target "
                       "http://127.0.0.1:8000", Exit.USAGE)
    if scrape_max_bytes <= 0:
        raise fail(f"--scrape-max-bytes {scrape_max_bytes}: must be positive (default 33554432, 32 MiB)", Exit.USAGE)
