"""`vllm-sentinel export grafana`: the rule pack as a Grafana dashboard for a fleet's Prometheus."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from vllm_sentinel.agent.alerts.grafana import dashboard
from vllm_sentinel.agent.alerts.rulefile import expand_rule_paths, load_rule_files
from vllm_sentinel.agent.alerts.rulemodel import RuleFileError
from vllm_sentinel.agent.alerts.rulepack import packaged_rules_dir
from vllm_sentinel.agent.alerts.ruleparams import load_params_file
from vllm_sentinel.agent.cli.common import ParamsOption, RulesOption, err, fail
from vllm_sentinel.agent.promql.parser import PromQLError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Export to the tools a fleet already runs (a Grafana dashboard; the rules: `rules export`).")


@app.command("grafana")
def grafana(out_file: Optional[Path] = typer.Option(None, "--out", help="write the dashboard JSON here (default: stdout)"),
            rules: Optional[list[Path]] = RulesOption, params: Optional[Path] = ParamsOption,
            title: str = typer.Option("vLLM sentinel: incidents and evidence", help="the dashboard's title"),
            uid: str = typer.Option("vllm-sentinel", help="the dashboard's uid (stable, so a re-import replaces it)")) -> None:
    """A Grafana dashboard: a row per incident family, a panel per rule of its evidence PromQL (${datasource}, $model_name, $instance)."""
    if not uid or len(uid) > 40:
        raise fail(f"--uid {uid!r}: Grafana takes 1 to 40 characters, e.g. vllm-sentinel", 2)
    try:
        overrides = load_params_file(params) if params else None
        files = load_rule_files(expand_rule_paths(list(rules) if rules else [packaged_rules_dir()]), overrides)
        doc = dashboard(files, title=title, uid=uid)
    except RuleFileError as e:
        raise fail("; ".join(e.problems)) from None
    except PromQLError as e:
        raise fail(f"an evidence expression cannot go on a dashboard: {e}") from None
    text = json.dumps(doc, indent=2) + "\n"
    if out_file is None:
        sys.stdout.write(text)
        return
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text(text)
    except OSError as e:
        raise fail(f"cannot write --out {out_file}: {e.strerror or e}; pick a writable path") from None
    err.print(f"wrote {out_file}", highlight=False)
