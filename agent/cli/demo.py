"""`vllm-sentinel demo`: the whole pipeline on a real vLLM CPU server, or `--replay` on a recorded session."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vllm_sentinel.agent.cli.common import Exit, err, fail, out
from vllm_sentinel.agent.daemon.cpu_budget import CpuBudget, parse_budget
from vllm_sentinel.agent.demo.live import DemoError, run_demo, run_replay_demo
from vllm_sentinel.reports.compare_view import render_compare
from vllm_sentinel.reports.console import render_diagnosis

app = typer.Typer(add_completion=False)


def _say(message: str) -> None:
    err.print(f"[cyan]==>[/] {message}", highlight=False)


@app.command()
def demo(replay: bool = typer.Option(False, "--replay", help="seconds, no server: the same pipeline on a recorded real session"),
         seconds: Optional[int] = typer.Option(None, help="hold each incident this long (default: long enough for the rules' `for`)"),
         workdir: Optional[Path] = typer.Option(None, help="where databases, logs and reports go (default: ./vllm-sentinel-demo)"),
         cpu_budget: Optional[str] = typer.Option(None, "--cpu-budget", help="the sidecar's CPU budget, as `vllm-sentinel run --cpu-budget` (default 10%)")) -> None:
    """The embedded default: a real vLLM CPU server, traffic that causes incidents, the sidecar, a diagnosis."""
    if seconds is not None and seconds <= 0:
        raise fail(f"--seconds {seconds}: give how long to hold each incident, a positive number of seconds", Exit.USAGE)
    if workdir is not None and workdir.exists() and not workdir.is_dir():
        raise fail(f"--workdir {workdir} is a file; give a directory (it is created when missing)", Exit.USAGE)
    try:
        budget = parse_budget(cpu_budget) if cpu_budget is not None else None
    except ValueError as e:
        raise fail(str(e), Exit.USAGE) from None
    try:
        doc = run_replay_demo(workdir, _say) if replay else run_demo(seconds, workdir, _say, cpu_budget=budget)
    except DemoError as e:
        raise fail(str(e)) from None
    render_diagnosis(out, doc, "table")
    if "compare" in doc:
        out.print("\n[bold]Verifying the fix[/] (vllm-sentinel compare --change auto):")
        render_compare(out, doc["compare"])  # its prediction block: the model's figures beside the measurement
    elif replay:
        out.print("\nThe recorded session has no run after a fix: `vllm-sentinel demo` (live) verifies it with compare.",
                  highlight=False)
    budget_line = CpuBudget.run_summary(doc["cpu_budget"]) if doc.get("cpu_budget") else ""
    if budget_line:
        out.print(f"\n{budget_line}", highlight=False)
    out.print(f"\nDatabase: {doc['database']}  (vllm-sentinel diagnose --db {doc['database']} --since 1h"
              f"{' --until ' + doc['window']['end'] if replay else ''})", highlight=False)
    for path in doc.get("reports", []):
        out.print(f"Report: {path}", highlight=False)
