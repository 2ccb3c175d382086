"""`vllm-sentinel run`: the sidecar daemon, wired from its options and run until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlparse

import typer

from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.cli.common import (DbOption, Exit, ParamsOption, RulesOption, db_path, duration_ms,
                                            duration_s, err, fail)
from vllm_sentinel.agent.cli.run_config import (FromFile, RunConfigError, load_run_config, locate, merged,
                                                option_kinds, typed_params)
from vllm_sentinel.agent.daemon.client import ApiError
from vllm_sentinel.agent.daemon.cpu_budget import parse_budget
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.agent.daemon.wiring import DaemonOptions, build_sidecar, default_scrape_timeout_s
from vllm_sentinel.agent.store.db import StoreError

app = typer.Typer(add_completion=False)


# What `run` uses for an option neither the command line nor --config gives. The options themselves
# default to None, so a --config file is never silently overridden by a default.
DEFAULTS: dict[str, Any] = {
    "interval": "1s", "scrape_timeout": "", "scrape_max_bytes": 32 * 2**20, "retention": "7d",
    "metrics_port": 9464, "metrics_host": "127.0.0.1", "nvml": "auto", "eval_interval": "5s",
    "vllm_profiler": "", "cpu_budget": "10%", "store_memory": "256MB", "duration": "", "verbose": False,
}
D = DEFAULTS


@app.command()
def run(ctx: typer.Context,
        config: Optional[Path] = typer.Option(None, "--config", help="YAML file of any of these options (keys as the long option names, e.g. `scrape-timeout: 3s`); the command line wins over it"),
        target: Optional[list[str]] = typer.Option(None, "--target", "-t", help="vLLM server URL (repeatable), e.g. http://127.0.0.1:8000"),
        targets_file: Optional[Path] = typer.Option(None, "--targets-file", help="more targets, in Prometheus file_sd format (JSON or YAML: a list of `targets` + `labels`; the labels go on every series of those targets); re-read when it changes"),
        db: Optional[Path] = DbOption,
        interval: Optional[str] = typer.Option(None, help=f"collection interval (default {D['interval']})"),
        scrape_timeout: Optional[str] = typer.Option(None, help="per-scrape timeout (default: the interval, at least 3s, at most 10s)"),
        scrape_max_bytes: Optional[int] = typer.Option(None, help=f"largest /metrics answer read, in bytes (default {D['scrape_max_bytes']})"),
        retention: Optional[str] = typer.Option(None, help=f"keep this much history; older hours are dropped whole (default {D['retention']})"),
        metrics_port: Optional[int] = typer.Option(None, help=f"own /metrics, /healthz and /readyz on this port (default {D['metrics_port']}; 0: off)"),
        metrics_host: Optional[str] = typer.Option(None, help=f"address the own /metrics listens on (default {D['metrics_host']}; 0.0.0.0 in a pod, for probes and Prometheus)"),
        nvml: Optional[str] = typer.Option(None, help="GPU counters via NVML: auto (when nvidia-ml-py is installed; the default), on, off"),
        rules: Optional[list[Path]] = RulesOption,
        params: Optional[Path] = ParamsOption,
        eval_interval: Optional[str] = typer.Option(None, help=f"rule evaluation interval (default {D['eval_interval']})"),
        reports_dir: Optional[Path] = typer.Option(None, help="incident reports go here (default: <db>.reports/)"),
        alertmanager: Optional[list[str]] = typer.Option(None, "--alertmanager", help="send incidents as alerts to this Alertmanager, e.g. http://127.0.0.1:9093 (repeatable)"),
        vllm_profiler: Optional[str] = typer.Option(None, "--vllm-profiler", help="also run vLLM's own profiler (torch, or nsys under `nsys launch`) this long, e.g. 3s, when a stack-explained incident opens; it slows serving, so at most once per target per 10 min (default: off)"),
        cpu_budget: Optional[str] = typer.Option(None, "--cpu-budget", help=f"the daemon's CPU, as a share of one core (e.g. 5% or 0.05; default {D['cpu_budget']}): above it, stack captures, profiler runs and reports wait, and on a saturated host the interval stretches (up to 8x)"),
        store_memory: Optional[str] = typer.Option(None, "--store-memory", help=f"DuckDB's memory for the store (e.g. 256MB or 1GiB; default {D['store_memory']}): past it, cached blocks are evicted and large sorts spill to disk beside the --db"),
        duration: Optional[str] = typer.Option(None, help="stop after this long (default: until SIGTERM/SIGINT)"),
        verbose: Optional[bool] = typer.Option(None, "-v", help="log to stderr")) -> None:
    """The sidecar daemon: scrape, store, evaluate, serve the local API."""
    try:
        from_file = load_run_config(config, option_kinds(run)) if config is not None else {}
    except RunConfigError as e:
        raise fail(str(e), Exit.USAGE) from None
    given = typed_params({k: val for k, val in ctx.params.items() if k != "config"}, option_kinds(run))
    v = merged(DEFAULTS, from_file, given)
    logging.basicConfig(level=logging.INFO if v["verbose"] else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options, stop_after = _daemon_options(v, from_file)
        sidecar = build_sidecar(options)
    except typer.Exit:
        raise
    except (StoreError, ApiError, RuleFileError, ValueError, OSError) as e:
        raise fail(locate(str(e), from_file)) from None
    watching = ", ".join(options.targets) + (f" + the targets in {options.targets_file}" if options.targets_file else "")
    err.print(f"vllm-sentinel: watching {watching.lstrip(', +')} every {options.interval_s:g}s -> {options.db} "
              f"(API {socket_path_for(options.db)}"
              + (f", /metrics on {options.metrics_host}:{options.metrics_port})" if options.metrics_port else ")"),
              highlight=False)
    try:
        sidecar.run_forever(stop_after)
    finally:
        sidecar.store.close()


def _daemon_options(v: dict[str, Any], from_file: dict[str, FromFile]) -> tuple[DaemonOptions, float | None]:
    """The merged option values, checked and converted; a bad one exits 2 naming --flag or FILE:LINE."""
    def flag(name: str) -> str:
        hit = from_file.get(name)
        return hit.where if hit is not None and v[name] == hit.value else "--" + name.replace("_", "-")

    interval_s = duration_s(v["interval"], flag("interval"))
    targets = list(v.get("target") or [])
    _check_run_inputs(targets, v["scrape_max_bytes"], flag)
    try:
        budget = parse_budget(v["cpu_budget"])
    except ValueError as e:
        raise fail(locate(str(e), from_file), Exit.USAGE) from None
    scrape_timeout = v["scrape_timeout"]
    options = DaemonOptions(
        targets=targets, targets_file=v.get("targets_file"), db=db_path(v.get("db")), interval_s=interval_s,
        scrape_timeout_s=(duration_s(scrape_timeout, flag("scrape_timeout")) if scrape_timeout
                          else default_scrape_timeout_s(interval_s)),
        retention_ms=duration_ms(v["retention"], flag("retention")), metrics_port=v["metrics_port"] or None,
        metrics_host=v["metrics_host"], nvml=v["nvml"], scrape_max_bytes=v["scrape_max_bytes"],
        rules=v.get("rules") or None, eval_interval_s=duration_s(v["eval_interval"], flag("eval_interval")),
        reports_dir=v.get("reports_dir"), params=v.get("params"),
        vllm_profiler_s=duration_s(v["vllm_profiler"], flag("vllm_profiler")) if v["vllm_profiler"] else None,
        alertmanagers=list(v.get("alertmanager") or []), cpu_budget=budget, store_memory=v["store_memory"])
    return options, duration_s(v["duration"], flag("duration")) if v["duration"] else None


def _check_run_inputs(targets: list[str], scrape_max_bytes: int, flag: Callable[[str], str]) -> None:
    """Refuse a target that is not an http(s) URL, or a non-positive --scrape-max-bytes (exit 2)."""
    for t in targets:
        url = urlparse(t)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise fail(f"{flag('target')} {t!r} is not an http(s) URL; pass the vLLM server, e.g. --target "
                       "http://127.0.0.1:8000", Exit.USAGE)
    if scrape_max_bytes <= 0:
        raise fail(f"{flag('scrape_max_bytes')} {scrape_max_bytes}: must be positive (default 33554432, 32 MiB)",
                   Exit.USAGE)
