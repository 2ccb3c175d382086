"""`vllm-sentinel demo`: a real vLLM CPU server with a tiny model, traffic that causes incidents, the
sidecar watching, the diagnosis and the incident reports, then the fix verified: the server restarted
with the value the diagnosis computed, the same traffic again, and `compare`'s verdict. `--replay`
runs the diagnosis in seconds on a recorded real session shipped with the project (that session
has no after-window, so it skips the verification)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.daemon.wiring import DaemonOptions, build_sidecar
from vllm_sentinel.agent.demo import scenarios
from vllm_sentinel.agent.demo.child_load import run_in_child
from vllm_sentinel.agent.demo.progress import Progress
from vllm_sentinel.agent.demo.replay import run_replay
from vllm_sentinel.agent.demo.tiny_model import build_tiny_model
from vllm_sentinel.agent.demo.verify import compare_around_change, fix_to_apply, restart_with_fix
from vllm_sentinel.agent.demo.vllm_server import VllmServer, VllmServerError
from vllm_sentinel.agent.diagnosis.diagnose import diagnose
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.reports.assemble import assemble_incident
from vllm_sentinel.reports.write import write_report

Say = Callable[[str], None]
# two incidents in sequence on one server: requests queue behind 4 sequence slots, then
# 400-token requests overflow 8 KV blocks and the scheduler preempts for real
LIVE_SEQUENCE = ["queue_blocking", "kv_cache_pressure"]
# seconds per stage beyond a scenario's hold (its ramp, drain and settling) and for the stages with no
# hold, as a live demo on a 2-core VM took them; they only feed the "time left" of the progress lines
SCENARIO_EXTRA_S = 12.0
STAGE_S = {"model": 8.0, "server": 60.0, "rank": 25.0, "restart": 60.0, "reports": 40.0}


def demo_plan(seconds: int | None = None) -> list[tuple[str, float]]:
    """The live demo's stages with the seconds each is expected to take (`seconds` holds each incident)."""
    def hold(name: str) -> float:
        return (float(seconds) if seconds else scenarios.DEFAULT_HOLD_S[name]) + SCENARIO_EXTRA_S
    return [("model", STAGE_S["model"]), ("server", STAGE_S["server"]),
            *[(name, hold(name)) for name in LIVE_SEQUENCE],
            ("rank", STAGE_S["rank"]), ("restart", STAGE_S["restart"]), ("verify", hold(LIVE_SEQUENCE[-1])),
            ("reports", STAGE_S["reports"])]


class DemoError(Exception):
    """The demo could not run; the message says what is missing."""


def default_workdir() -> Path:
    """Where the demo keeps its databases, logs and reports: ./vllm-sentinel-demo."""
    return Path.cwd() / "vllm-sentinel-demo"


def write_reports(store: Store, doc: dict, out_dir: Path, rules: list, say: Say) -> list[Path]:
    """One Markdown report (with charts) per incident of the diagnosis; returns the report paths."""
    end_ms = int(time.time() * 1000)
    paths = []
    for inc in doc["incidents"]:
        data = assemble_incident(store, inc, now_ms=end_ms, rules=rules, source=doc["source"])
        written = write_report(data, out_dir)
        say(f"report: {written.markdown}")
        paths.append(written.markdown)
    return paths


def run_demo(seconds: int | None = None, workdir: Path | None = None, say: Say = lambda _m: None,
             cpu_budget: float | None = None) -> dict:
    """Start server, sidecar and the incident sequence; return the diagnose document (+ 'reports')."""
    workdir = Path(workdir or default_workdir())
    workdir.mkdir(parents=True, exist_ok=True)
    progress = Progress(say, demo_plan(seconds))
    say = progress
    say("building the tiny random-weight Llama (cached after the first run)")
    try:
        model_dir = build_tiny_model()  # transformers, tokenizers and torch load here: the server extra
    except ImportError as e:
        raise DemoError(f"the demo needs the server extra ({e.name} missing): pip install 'vllm-sentinel[server]' "
                        "or run `make demo`; `vllm-sentinel demo --replay` needs none of it") from e
    db = workdir / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.duckdb"
    server = VllmServer(scenarios.scenario_server_config(model_dir), log_path=workdir / "vllm-server.log")
    progress.begin("server")
    say(f"starting vLLM on CPU: 4 sequences, 8 KV blocks of 128 tokens (30-90 s; log: {server.log_path.name})")
    try:
        server.start()
    except VllmServerError as e:
        raise DemoError(str(e)) from e
    pack = load_pack()
    try:
        say(f"vLLM ready at {server.url} after {server.startup_seconds:.0f} s; the sidecar records into {db.name}")
        sidecar = build_sidecar(DaemonOptions(targets=[server.url], db=db, interval_s=1.0, metrics_port=None,
                                              reports_dir=workdir / "live-reports",
                                              **({"cpu_budget": cpu_budget} if cpu_budget is not None else {})))
        start_ms = int(time.time() * 1000)
        sidecar.start()
        try:
            runs = []
            for name in LIVE_SEQUENCE:
                progress.begin(name)
                runs.append(run_in_child(name, server, float(seconds) if seconds else None, say))
                _said_done(runs[-1], say)
            verified, applied = _apply_fix_and_rerun(server, sidecar, pack, runs[-1], seconds, progress)
            time.sleep(scenarios.SETTLE_S)
        except scenarios.ScenarioError as e:  # the load's clients could not run: say why, in one line
            raise DemoError(str(e)) from e
        finally:
            budget = sidecar.config.cpu_budget
            cpu = budget.status() if budget is not None else None
            sidecar.stop()
            sidecar.store.close()
    finally:
        server.stop()
    progress.begin("reports")
    end_ms = int(time.time() * 1000)
    with Store.open(db, read_only=True) as store:
        doc = diagnose(store, start_ms, end_ms, evaluate_window=pack_window_evaluator(pack))
        for s in doc.get("summary", []):
            s["last_error"] = None  # the demo stopped its own server: its last failed scrape is no finding
        doc["reports"] = [str(p) for p in write_reports(store, doc, workdir / "reports", pack, say)]
        if verified is not None:
            say("comparing before and after the fix (compare --change auto)")
            doc["compare"] = compare_around_change(store, runs[-1].start_ms, verified.end_ms, pack)
            doc["applied_fix"] = applied  # with the model's prediction, shown beside what compare measured
    doc["database"] = str(db)
    if cpu is not None:
        doc["cpu_budget"] = cpu
    return doc


def _said_done(run: scenarios.ScenarioRun, say: Say) -> None:
    t = run.traffic
    load = f", {t.ok} requests ok, {t.failed} failed" if t else ""
    say(f"{run.name} scenario done in {run.seconds:.0f} s{load}")


def _apply_fix_and_rerun(server: VllmServer, sidecar: Any, pack: list, run: scenarios.ScenarioRun, seconds: int | None,
                         say: Progress) -> tuple[scenarios.ScenarioRun | None, dict | None]:
    """Restart the server with the first-ranked fix the diagnosis of `run` computed and run the same scenario
    again; the run after the fix and the fix applied (None, None when there was none to apply)."""
    say.begin("rank")
    found = diagnose(sidecar.store.reader(), run.start_ms, run.end_ms, evaluate_window=pack_window_evaluator(pack))
    fix = fix_to_apply(found["incidents"], run.name)
    if fix is None:
        say(f"no computed {run.name} fix to verify ({len(found['incidents'])} incident(s) in its window)")
        return None, None
    ranked = ""
    if fix.get("rank"):
        above = "" if fix["rank"] == 1 else "; above it: replicas, not a flag of one server"
        ranked = f" (ranked {fix['rank']} by predicted goodput{above})"
    say(f"applying the fix {fix['param']} {fix['current']} -> {fix['suggested']}{ranked}: restarting vLLM")
    say.begin("restart")
    try:
        restart_with_fix(server, fix)
    except VllmServerError as e:
        raise DemoError(str(e)) from e
    say.begin("verify")
    again = run_in_child(run.name, server, float(seconds) if seconds else None, say)
    _said_done(again, say)
    return again, fix


def run_replay_demo(workdir: Path | None = None, say: Say = lambda _m: None) -> dict:
    """The same pipeline on the shipped recording of a real session: seconds, no server needed."""
    workdir = Path(workdir or default_workdir())
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / f"replay-{time.strftime('%Y%m%d-%H%M%S')}.duckdb"
    doc = run_replay(say=say, db=db)
    with Store.open(db, read_only=True) as store:
        doc["reports"] = [str(p) for p in write_reports(store, doc, workdir / "reports", load_pack(), say)]
    doc["database"] = str(db)
    return doc
