"""`vllm-sentinel rules test|check|list|export`: a thin typer sub-app over the rules library."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from vllm_sentinel.agent.alerts.export import ExportError, dump_yaml, export_rules
from vllm_sentinel.agent.alerts.prometheusrule import prometheus_rule_resource
from vllm_sentinel.agent.alerts.rulefile import expand_rule_paths, load_rule_files, rule_test_path
from vllm_sentinel.agent.alerts.rulelint import lint_rules
from vllm_sentinel.agent.alerts.rulemodel import RuleFile, RuleFileError
from vllm_sentinel.agent.alerts.rulepack import packaged_rules_dir
from vllm_sentinel.agent.alerts.ruleparams import load_params_file
from vllm_sentinel.agent.alerts.ruletest import junit_xml, promtool_lines, run_tests
from vllm_sentinel.agent.cli.common import out, print_json
from vllm_sentinel.agent.diagnosis.fixes import FIXES
from vllm_sentinel.agent.diagnosis.window import evaluate_episodes
from vllm_sentinel.collectors.timefmt import format_prometheus_duration_ms

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Rule files: test them like promtool, lint them, list them, export them for Prometheus.")
err = Console(stderr=True)  # not soft-wrapped: long problem lines wrap at the terminal width, as they always have

PathsArg = typer.Argument(None, help="rule files or directories (default: the rules shipped with vllm-sentinel)")
ParamsOpt = typer.Option(None, "--params", help="YAML file of threshold parameters (name: value) overriding the rule files' params")


def _rule_paths(paths: Optional[list[Path]]) -> list[Path]:
    return expand_rule_paths(list(paths) if paths else [packaged_rules_dir()])


def _load(paths: Optional[list[Path]], params: Optional[Path] = None) -> list[RuleFile]:
    try:
        return load_rule_files(_rule_paths(paths), load_params_file(params) if params else None)
    except RuleFileError as e:
        for p in e.problems:
            err.print(p, highlight=False, markup=False, soft_wrap=True)  # one problem, one line (grep, CI logs)
        raise typer.Exit(1) from None


@app.command("test")
def test(files: Optional[list[Path]] = typer.Argument(None, help="test files (default: the shipped rules/tests/*.test.yaml)"),
         run: Optional[list[str]] = typer.Option(None, "--run", help="only test groups whose name matches this regex (repeatable)"),
         junit: Optional[Path] = typer.Option(None, "--junit", help="also write a JUnit XML report here")) -> None:
    """Run rule unit tests in promtool's format; exit 0 when all pass, 1 otherwise (as promtool)."""
    paths = list(files) if files else sorted((packaged_rules_dir() / "tests").glob("*.test.yaml"))
    if not paths:
        err.print("no test files given and none shipped in rules/tests/", highlight=False)
        raise typer.Exit(1)
    _check_test_inputs(paths, run)
    code, outcomes = run_tests(paths, run, episodes=evaluate_episodes)
    for stream, line in promtool_lines(outcomes):
        (sys.stdout if stream == "out" else sys.stderr).write(line + "\n")
        (sys.stdout if stream == "out" else sys.stderr).flush()
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(junit_xml(outcomes))
    raise typer.Exit(code)


def _check_test_inputs(paths: list[Path], run: Optional[list[str]]) -> None:
    """Refuse an unreadable test file or a --run that is not a regex: one line each, exit 2."""
    for pattern in run or []:
        try:
            re.compile(pattern)
        except re.error as e:
            err.print(f"error: --run {pattern!r} is not a regular expression ({e}); e.g. --run 'kv_.*'",
                      highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(2) from None
    for p in paths:
        try:
            p.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            err.print(f"error: cannot read test file {p}: {getattr(e, 'strerror', None) or e}; pass a promtool-format "
                      "test file (YAML)", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(2) from None


@app.command("check")
def check(paths: Optional[list[Path]] = PathsArg, params: Optional[Path] = ParamsOpt) -> None:
    """Lint rule files: schema, unique alert names, incident/severity labels, summary, a test file per rule file."""
    files = _load(paths, params)
    problems = lint_rules(files, set(FIXES))
    for p in problems:
        err.print(p, highlight=False, markup=False)
    n = sum(len(f.rules) for f in files)
    if problems:
        err.print(f"{len(problems)} problem(s) in {len(files)} file(s)", highlight=False)
        raise typer.Exit(1)
    out.print(f"SUCCESS: {n} rules in {len(files)} file(s)", highlight=False)


@app.command("list")
def list_rules(paths: Optional[list[Path]] = PathsArg,
               fmt: str = typer.Option("table", "--format", help="table or json"),
               params: Optional[Path] = ParamsOpt) -> None:
    """List the rules: name, kind, incident, severity, for, where."""
    rows = [{"name": r.name, "kind": r.kind, "incident": r.incident, "severity": r.severity,
             "for": format_prometheus_duration_ms(r.for_ms), "group": r.group, "where": r.where}
            for f in _load(paths, params) for r in f.rules]
    if fmt == "json":
        print_json(rows)
        return
    if fmt != "table":
        err.print(f"--format {fmt!r}: use table or json", highlight=False)
        raise typer.Exit(2)
    table = Table("rule", "kind", "incident", "severity", "for", "where")
    for r in rows:
        table.add_row(r["name"], r["kind"], r["incident"] or "", r["severity"] or "", r["for"], r["where"])
    out.print(table)


@app.command("export")
def export(out_dir: Optional[Path] = typer.Option(None, "--out", help="--format files: the directory for the rule files and tests; --format prometheusrule: the file (default: stdout)"),
           paths: Optional[list[Path]] = PathsArg, params: Optional[Path] = ParamsOpt,
           fmt: str = typer.Option("files", "--format", help="files (plain Prometheus rule files and their tests) or prometheusrule (one Prometheus Operator resource)"),
           name: str = typer.Option("vllm-sentinel", "--name", help="prometheusrule: the resource's metadata.name"),
           namespace: Optional[str] = typer.Option(None, "--namespace", help="prometheusrule: its metadata.namespace (default: none, kubectl's)"),
           label: Optional[list[str]] = typer.Option(None, "--label", help="prometheusrule: a metadata label KEY=VALUE, e.g. release=kube-prometheus-stack for its ruleSelector (repeatable)")) -> None:
    """Write the pack for a fleet's Prometheus: rule files (our keys as annotations, parameters substituted) and tests, or a PrometheusRule."""
    if fmt not in ("files", "prometheusrule"):
        err.print(f"error: --format {fmt!r}: use files or prometheusrule", highlight=False, markup=False)
        raise typer.Exit(2)
    if fmt == "files" and out_dir is None:
        err.print("error: --format files needs --out DIR (or use --format prometheusrule for stdout)",
                  highlight=False, markup=False)
        raise typer.Exit(2)
    rule_paths = _rule_paths(paths)
    try:
        overrides = load_params_file(params) if params else None
        if fmt == "prometheusrule":
            resource = prometheus_rule_resource(load_rule_files(rule_paths, overrides), name, namespace,
                                                _labels(label))
            _write_or_print(out_dir, _GENERATED + dump_yaml(resource))
            return
        tests = [t for p in rule_paths if (t := rule_test_path(p)).is_file()]
        if overrides is not None:
            load_rule_files(rule_paths, overrides)  # unknown names fail naming the --params file
        result = export_rules(rule_paths, tests, out_dir, overrides.values if overrides else None)
    except (RuleFileError, ExportError) as e:
        err.print(str(e), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except OSError as e:
        err.print(f"error: cannot write to --out {out_dir}: {e.strerror or e}; pick a writable directory",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    for p in result.rule_files + result.test_files:
        out.print(f"wrote {p}", highlight=False)


_GENERATED = "# Generated by `vllm-sentinel rules export --format prometheusrule`; edit the rule files, not this.\n"


def _labels(pairs: Optional[list[str]]) -> dict[str, str]:
    """--label KEY=VALUE pairs; a malformed one exits 2."""
    labels = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            err.print(f"error: --label {pair!r}: write KEY=VALUE, e.g. --label release=kube-prometheus-stack",
                      highlight=False, markup=False)
            raise typer.Exit(2)
        labels[key] = value
    return labels


def _write_or_print(path: Optional[Path], text: str) -> None:
    """The text to the file (saying so on stderr), else to stdout."""
    if path is None:
        sys.stdout.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    err.print(f"wrote {path}", highlight=False, markup=False)
