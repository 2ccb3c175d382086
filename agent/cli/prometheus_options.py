"""`--prometheus URL` and its companions, defined once for every command that reads a fleet's Prometheus.

A command decorated with `@prometheus_options` gets the options below on its command line and receives
them as one `remote: PrometheusArgs`; `remote.engine(db)` is a RemoteEngine (agent/promql/remote.py) with
the same PromQL interface as the local store's engine, or None for the local file. So `diagnose`,
`report`, `compare` and `capacity` evaluate the same way over either source.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer

from vllm_sentinel.agent.cli.common import Exit, fail
from vllm_sentinel.agent.promql.remote import RemoteEngine
from vllm_sentinel.agent.promql.scope import parse_selector
from vllm_sentinel.collectors.prometheus import (DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S, PrometheusClient,
                                                 PrometheusConnection, PrometheusError)

PrometheusOption = typer.Option(None, "--prometheus", help="read history from this Prometheus (or Thanos, Mimir, "
                                "VictoriaMetrics) instead of the DuckDB file, e.g. http://prometheus:9090")
SelectorOption = typer.Option(None, "--selector", help="with --prometheus: label matchers added to every "
                              "query's selectors, scoping it to the vLLM targets, e.g. '{job=\"vllm\"}'")
BearerTokenFileOption = typer.Option(None, "--bearer-token-file", help="with --prometheus: file holding a bearer token")
BasicAuthUserOption = typer.Option(None, "--basic-auth-user", help="with --prometheus: basic auth user name")
BasicAuthPasswordFileOption = typer.Option(None, "--basic-auth-password-file",
                                           help="with --basic-auth-user: file holding the password")
CaFileOption = typer.Option(None, "--ca-file", help="with an https --prometheus: PEM file of the CA to trust")
InsecureSkipVerifyOption = typer.Option(False, "--insecure-skip-verify",
                                        help="with an https --prometheus: do not verify its certificate")
PrometheusTimeoutOption = typer.Option(DEFAULT_TIMEOUT_S, "--prometheus-timeout", min=1.0,
                                       help="with --prometheus: seconds one request may take")
PrometheusConcurrencyOption = typer.Option(DEFAULT_CONCURRENCY, "--prometheus-concurrency", min=1, max=64,
                                           help="with --prometheus: queries in flight at once")


@dataclass(frozen=True)
class PrometheusArgs:
    """The --prometheus options as given on one command line."""

    prometheus: Optional[str] = None
    selector: Optional[str] = None
    bearer_token_file: Optional[Path] = None
    basic_auth_user: Optional[str] = None
    basic_auth_password_file: Optional[Path] = None
    ca_file: Optional[Path] = None
    insecure_skip_verify: bool = False
    prometheus_timeout: float = DEFAULT_TIMEOUT_S
    prometheus_concurrency: int = DEFAULT_CONCURRENCY

    def engine(self, db: Optional[Path], **remote_only: object) -> Optional[RemoteEngine]:
        """The RemoteEngine for --prometheus, or None for the local file (see `remote_source`)."""
        a = self
        return remote_source(a.prometheus, db, a.selector, a.bearer_token_file, a.basic_auth_user,
                             a.basic_auth_password_file, a.ca_file, a.insecure_skip_verify, a.prometheus_timeout,
                             a.prometheus_concurrency, **remote_only)


# each field's command-line option, in the order --help lists them
_OPTIONS = {"prometheus": PrometheusOption, "selector": SelectorOption,
            "bearer_token_file": BearerTokenFileOption, "basic_auth_user": BasicAuthUserOption,
            "basic_auth_password_file": BasicAuthPasswordFileOption, "ca_file": CaFileOption,
            "insecure_skip_verify": InsecureSkipVerifyOption, "prometheus_timeout": PrometheusTimeoutOption,
            "prometheus_concurrency": PrometheusConcurrencyOption}
_TYPES = {"prometheus": Optional[str], "selector": Optional[str], "bearer_token_file": Optional[Path],
          "basic_auth_user": Optional[str], "basic_auth_password_file": Optional[Path], "ca_file": Optional[Path],
          "insecure_skip_verify": bool, "prometheus_timeout": float, "prometheus_concurrency": int}

Command = TypeVar("Command", bound=Callable[..., Any])


def prometheus_options(command: Command) -> Command:
    """Give a typer command the --prometheus options; it receives them as its `remote: PrometheusArgs`.

    typer reads a command's options from its signature, so the wrapper shows the command's own
    parameters (less `remote`) followed by these, and folds them back into one PrometheusArgs.
    """
    names = [f.name for f in fields(PrometheusArgs)]
    own = [p for p in inspect.signature(command).parameters.values() if p.name != "remote"]
    added = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_OPTIONS[n], annotation=_TYPES[n])
             for n in names]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        remote = PrometheusArgs(**{n: kwargs.pop(n, getattr(PrometheusArgs, n)) for n in names})
        return command(*args, remote=remote, **kwargs)

    wrapper.__signature__ = inspect.Signature(own + added)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**{k: v for k, v in command.__annotations__.items() if k != "remote"}, **_TYPES}
    return wrapper  # type: ignore[return-value]


def remote_engine(url: str, selector: Optional[str] = None, bearer_token_file: Optional[Path] = None,
                  basic_auth_user: Optional[str] = None, basic_auth_password_file: Optional[Path] = None,
                  ca_file: Optional[Path] = None, insecure_skip_verify: bool = False,
                  timeout_s: float = DEFAULT_TIMEOUT_S, concurrency: int = DEFAULT_CONCURRENCY) -> RemoteEngine:
    """The RemoteEngine the options describe; a bad option exits 2 with one line naming it."""
    try:
        matchers = parse_selector(selector) if selector else ()
    except ValueError as e:
        raise fail(str(e), Exit.USAGE) from None
    conn = PrometheusConnection(url, bearer_token_file=_path(bearer_token_file), basic_auth_user=basic_auth_user,
                                basic_auth_password_file=_path(basic_auth_password_file), ca_file=_path(ca_file),
                                insecure_skip_verify=insecure_skip_verify, timeout_s=timeout_s,
                                max_concurrency=concurrency)
    try:
        return RemoteEngine(PrometheusClient(conn), matchers)
    except PrometheusError as e:
        raise fail(str(e), Exit.USAGE) from None


def remote_source(prometheus: Optional[str], db: Optional[Path], selector: Optional[str],
                  bearer_token_file: Optional[Path], basic_auth_user: Optional[str],
                  basic_auth_password_file: Optional[Path], ca_file: Optional[Path], insecure_skip_verify: bool,
                  timeout_s: float, concurrency: int, **remote_only: object) -> Optional[RemoteEngine]:
    """The RemoteEngine for --prometheus, or None for the local file; a contradiction exits 2.

    `remote_only` names the command's other options that mean something only with --prometheus.
    """
    refuse_remote_only(prometheus, selector=selector, bearer_token_file=bearer_token_file,
                       basic_auth_user=basic_auth_user, basic_auth_password_file=basic_auth_password_file,
                       ca_file=ca_file, insecure_skip_verify=insecure_skip_verify, **remote_only)
    if not prometheus:
        return None
    if db is not None:
        raise fail("--prometheus and --db are two sources of history: give one", Exit.USAGE)
    return remote_engine(prometheus, selector, bearer_token_file, basic_auth_user, basic_auth_password_file,
                         ca_file, insecure_skip_verify, timeout_s, concurrency)


def refuse_remote_only(prometheus: Optional[str], **given: object) -> None:
    """The Prometheus-only options without --prometheus are a mistake: say so instead of ignoring them."""
    if prometheus:
        return
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v not in (None, False)]
    if named:
        raise fail(f"{', '.join(named)} only apply with --prometheus URL", Exit.USAGE)


def _path(p: Optional[Path]) -> Optional[str]:
    return None if p is None else str(p)
