"""The what-if model against real restarts: predicted before, measured after, for each flag in turn.

A real vLLM CPU server (the scenarios' settings: 4 sequences, 8 KV blocks of 128 tokens) under a load,
the sidecar recording it; the model calibrated on that window ranks the trial flags; the server is then
restarted with each and the same load runs again (agent/demo/trials.py). Prints one row per restart:
rank, predicted and measured p95 TTFT and generated tokens/s with the model's error, goodput, verdict;
then the calibration, the wall time and the peak RSS. Asserts nothing. About 2 minutes per restart.
The third column from the right says how each prediction was judged (the live test asserts the same).

    .venv/bin/python bench/whatif_restarts.py [--hold 60] [--load kv_cache_pressure] [--keep-db PATH]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from vllm_sentinel.agent.daemon.cpu_budget import DEFAULT_BUDGET
from vllm_sentinel.agent.daemon.wiring import DaemonOptions, build_sidecar
from vllm_sentinel.agent.demo import scenarios
from vllm_sentinel.agent.demo.tiny_model import build_tiny_model
from vllm_sentinel.agent.demo.child_load import run_in_child
from vllm_sentinel.agent.demo.trials import Trial, TrialsReport, run_trials, sidecar_stored_through
from vllm_sentinel.agent.demo.vllm_server import VllmServer
from vllm_sentinel.agent.alerts.rulepack import load_pack

# the memory fix and two batch sizes as the live test restarts them (tests/integration/test_scenarios.py, which
# takes 3 for the smaller batch: one sequence a step starves this host's API server), and a 128-token budget
DEFAULT_TRIALS = ("--num-gpu-blocks-override=19", "--max-num-seqs=1", "--max-num-seqs=8", "--max-num-batched-tokens=128")


def parse_trial(text: str) -> Trial:
    flag, _, value = text.partition("=")
    return Trial(flag, int(value))


def table(report: TrialsReport) -> str:
    """The rows: each restart's prediction beside its measurement."""
    def n(v: object) -> str:
        return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    # frontend s: the API server's hold on each request past vLLM's e2e (a starved frontend the model leaves out);
    # clients s: the mean latency the load's clients saw
    head = f"{'trial':34} {'rank':>4} {'TTFT p95 pred/meas (err)':>28} {'tokens/s pred/meas (err)':>28} " \
           f"{'goodput pred/meas':>18} {'frontend s':>10} {'clients s':>9} {'judged':>8}  verdict"
    lines = [head]
    m = report.baseline_measured
    lines.append(f"{'as configured (measured)':34} {'':>4} {n(m.get('ttft_p95_s')):>28} "
                 f"{n(m.get('generation_tokens_per_s')):>28} {n(report.baseline_goodput_rps):>18} "
                 f"{n(m.get('frontend_s')):>10}")
    for o in report.outcomes:
        p = o.predicted or {}
        ttft = f"{n(p.get('ttft_p95_s'))}/{n(o.measured.get('ttft_p95_s'))} ({pct(o.error.get('ttft_p95_s'))})"
        tps = f"{n(p.get('throughput_tps'))}/{n(o.measured.get('generation_tokens_per_s'))} " \
              f"({pct(o.error.get('generation_tokens_per_s'))})"
        good = f"{n(p.get('goodput_rps'))}/{n(o.goodput_rps)}"
        judged = "-" if o.predicted is None else "unjudged" if o.unjudged else "over" if o.over else \
            "in band" if o.notes else "within"
        lines.append(f"{o.trial.label:34} {n(o.rank):>4} {ttft:>28} {tps:>28} {good:>18} "
                     f"{n(o.measured.get('frontend_s')):>10} {n(o.clients.get('mean_latency_s')):>9} {judged:>8}  "
                     f"{o.verdict}")
    # judged: within the 30 % bound, "in band" where a p95 passed as close as vLLM's buckets tell, or over;
    # unjudged where the window's steps ran past 20 % off the model's speed (agent/diagnosis/step_speed.py)
    lines += [f"  {o.trial.label}: {note}" for o in report.outcomes for note in o.notes]
    lines += [f"  {o.trial.label}: steps {o.step_speed['ratio']:.2f}x the model's, its replay at its own step time "
              f"{pct(o.step_speed['replay_error'].get('generation_tokens_per_s'))} off on tokens/s"
              for o in report.outcomes if o.step_speed]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hold", type=float, default=60.0, help="seconds of load per configuration")
    ap.add_argument("--load", default="kv_cache_pressure", choices=("kv_cache_pressure", "queue_blocking", "healthy"))
    ap.add_argument("--clients-in-process", action="store_true",
                    help="send the load from this process's threads, beside the sidecar (default: a child process)")
    ap.add_argument("--trial", action="append", help="FLAG=VALUE, repeatable (default: %s)" % ", ".join(DEFAULT_TRIALS))
    ap.add_argument("--cpu-budget", type=float, default=None,
                    help="the sidecar's budget, a fraction of one core (default: the daemon's; 1.0 with "
                         "--clients-in-process, whose threads the budget would charge to the sidecar)")
    ap.add_argument("--keep-db", type=Path, help="copy the sidecar's DuckDB here at the end")
    args = ap.parse_args()
    trials = [parse_trial(t) for t in (args.trial or DEFAULT_TRIALS)]
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="whatif-restarts-"))
    server = VllmServer(scenarios.scenario_server_config(build_tiny_model()), log_path=work / "server.log")
    server.start()
    # the sidecar only records: no rules, so no incident reports or stack captures (their chart-drawing
    # children took the CPU from vLLM mid-window: one restart's throughput fell from 8 to 5 req/s)
    (work / "no-rules").mkdir()
    sidecar = build_sidecar(DaemonOptions(targets=[server.url], db=work / "s.duckdb", interval_s=1.0,
                                          metrics_port=None, reports_dir=work / "reports", rules=[work / "no-rules"],
                                          cpu_budget=args.cpu_budget or (1.0 if args.clients_in_process
                                                                         else DEFAULT_BUDGET)))
    sidecar.start()
    try:
        def load(s: VllmServer, hold: float) -> scenarios.ScenarioRun:
            if args.clients_in_process:
                return scenarios.SCENARIOS[args.load](s, hold)
            return run_in_child(args.load, s, hold)

        report = run_trials(server, sidecar.store.reader, load,
                            trials, args.hold, load_pack(), say=lambda m: print(m, file=sys.stderr, flush=True),
                            wait_stored=lambda ms: sidecar_stored_through(sidecar, ms))
    finally:
        sidecar.stop()
        sidecar.store.close()
        server.stop()
    print(table(report))
    print("model:", json.dumps(report.model))
    print(f"wall {time.perf_counter() - t0:.0f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.keep_db:
        shutil.copy(work / "s.duckdb", args.keep_db)
        print(f"database kept at {args.keep_db}")
    print(json.dumps(report.as_dict()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
