"""Predict, restart, measure: the what-if model's ranking of engine flags checked on a real server.

A load runs on the server as configured; the model, calibrated on that window of the sidecar's history,
predicts each trial flag and ranks them as `diagnose` ranks an incident's fixes. Then the server is
restarted with each flag in turn (the sidecar keeps recording: one instance, a snapshot per restart),
the same load runs again, and what the server measured is set beside what was predicted: p95 TTFT and
throughput with the model's error, goodput and the verdict by `compare`'s one decision procedure. The
server is restarted as it was configured at the end (unless asked not to). A load whose window the host took
vLLM's CPU in (a CPU-backend worker under the model's contention bound) says nothing of the configuration: it
runs once more, and the second window is the one used. A window whose engine steps ran at another speed than the
model fitted (agent/diagnosis/step_speed.py) is measured and shown, but judges neither the prediction nor the
ranking. Used by bench/whatif_restarts.py and the live test.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_sentinel.agent.demo.scenarios import ScenarioRun
from vllm_sentinel.agent.demo.verify import FLAG_FIELDS
from vllm_sentinel.agent.demo.vllm_server import VllmServer
from vllm_sentinel.agent.diagnosis.compare import CompareRequest, compare
from vllm_sentinel.agent.diagnosis.compare_sources import store_source
from vllm_sentinel.agent.diagnosis.fix_ranking import Objectives, predict_fixes
from vllm_sentinel.agent.diagnosis.sim_calibrate import (ERROR_FLOORS, Unrepresentable, engine_config, judge,
                                                         lost_its_core, relative_error)
from vllm_sentinel.agent.diagnosis.sim_workload import Measured, Workload, read_workload
from vllm_sentinel.agent.diagnosis.step_speed import StepSpeed, step_speed, step_time_of
from vllm_sentinel.agent.diagnosis.whatif import store_configs
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.collectors.timefmt import iso_seconds

Say = Callable[[str], None]
Scenario = Callable[[VllmServer, float], ScenarioRun]
# a load's first seconds: its child process starts and the first requests fill the server (each load begins on
# an idle or freshly restarted server, so nothing of the previous one drains into it)
RAMP_MS = 10_000
COMPARE_INTERVAL_MS = 5_000
MIN_STEADY_MS = 25_000  # the least of a load measured: 5 of compare's intervals, what its significance test needs
# the prediction is judged on these, by the model's own reading of a window (p95s through vLLM's buckets)
JUDGED = ("ttft_p95_s", "generation_tokens_per_s")


@dataclass(frozen=True)
class Trial:
    """One engine flag a server of agent/demo/vllm_server.py takes, at one value."""

    flag: str
    value: int

    @property
    def label(self) -> str:
        return f"{self.flag} {self.value}"


@dataclass
class TrialOutcome:
    """A trial's prediction (before its restart), its measurement (after) and the model's error."""

    trial: Trial
    current: int | None
    rank: int | None = None
    predicted: dict[str, Any] | None = None
    measured: dict[str, Any] = field(default_factory=dict)
    error: dict[str, float | None] = field(default_factory=dict)
    over: list[str] = field(default_factory=list)  # judged figures past the model's bound (calibration's judge)
    notes: list[str] = field(default_factory=list)  # p95s the buckets cannot tell from the measured p90..p99
    goodput_rps: float | None = None
    verdict: str | None = None
    window: tuple[int, int] | None = None
    clients: dict[str, Any] = field(default_factory=dict)  # what the load's clients saw (traffic_seen)
    compare: dict[str, Any] = field(default_factory=dict)  # compare's document, baseline vs this trial
    worker_busy: float | None = None  # cores the CPU backend's worker ran in the window (None: not read)
    reruns: int = 0  # loads run again because the host took vLLM's CPU in the window
    step_speed: dict[str, Any] | None = None  # the window's steps against the model's step time (StepSpeed)
    unjudged: str | None = None  # why the measurement judges neither the prediction nor the ranking

    @property
    def comparable(self) -> bool:
        """Whether the window measured the configuration, not the host: its worker held its core and its steps ran
        at the model's speed."""
        return not lost_its_core(self.worker_busy) and self.unjudged is None

    def as_dict(self) -> dict[str, Any]:
        """The outcome as JSON-ready data."""
        d = dataclasses.asdict(self)
        d["trial"] = self.trial.label
        d["window"] = None if self.window is None else [iso_seconds(t) for t in self.window]
        return d


@dataclass
class TrialsReport:
    """The baseline window, the model block of its calibration, and every trial's outcome in ranked order."""

    baseline: tuple[int, int]
    baseline_measured: dict[str, Any]
    baseline_goodput_rps: float | None
    model: dict[str, Any]
    outcomes: list[TrialOutcome]
    baseline_reruns: int = 0

    def ranked_first(self) -> TrialOutcome | None:
        """The trial the model ranked first (None while withheld)."""
        return next((o for o in self.outcomes if o.rank == 1), None)

    def measured_best(self) -> TrialOutcome | None:
        """Of the trials whose windows measured the configuration (TrialOutcome.comparable), the one whose measured
        goodput was highest (ties: higher measured throughput)."""
        done = [o for o in self.outcomes if o.goodput_rps is not None and o.comparable]
        return max(done, key=lambda o: (o.goodput_rps or 0.0, o.measured.get("generation_tokens_per_s") or 0.0),
                   default=None)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {"baseline": [iso_seconds(t) for t in self.baseline], "baseline_measured": self.baseline_measured,
                "baseline_goodput_rps": self.baseline_goodput_rps, "model": self.model,
                "baseline_reruns": self.baseline_reruns, "outcomes": [o.as_dict() for o in self.outcomes]}


def traffic_seen(run: ScenarioRun) -> dict[str, Any]:
    """Requests the load's clients sent, completed and lost, and their mean latency as the clients timed it
    (beside the server's e2e mean it shows time spent outside vLLM's engine: HTTP, a starved client)."""
    t = run.traffic
    if t is None:
        return {}
    mean = sum(t.latencies_s) / len(t.latencies_s) if t.latencies_s else None
    return {"sent": t.sent, "ok": t.ok, "failed": t.failed, "elapsed_s": round(t.elapsed_s, 1),
            "mean_latency_s": None if mean is None else round(mean, 3), "errors": t.errors[:3]}


def measured_window(store: Any, instance: str, window: tuple[int, int]) -> Workload:
    """The window as the model's calibration reads it: what the server measured, and the worker's CPU."""
    return read_workload(Engine(store), instance, window[0], window[1])


def predict(store: Any, instance: str, window: tuple[int, int], trials: Sequence[Trial],
            config: dict[str, Any], objectives: Objectives) -> tuple[dict[str, Any], list[TrialOutcome]]:
    """The model block and each trial's outcome with its prediction and rank, in ranked order, from the window."""
    fixes = [{"param": t.flag, "current": str(config.get(FLAG_FIELDS[t.flag])), "suggested": str(t.value),
              "trial": t} for t in trials]
    incident = {"instance": instance, "start": iso_seconds(window[0]), "end": iso_seconds(window[1]), "fixes": fixes}
    # exactly the steady window: an incident's usual stretch reaches a minute back, into the ramp
    predict_fixes(Engine(store), store_configs(store, *window), incident, *window, objectives)
    outcomes = [TrialOutcome(f["trial"], config.get(FLAG_FIELDS[f["trial"].flag]), f.get("rank"), f.get("predicted"))
                for f in incident["fixes"]]
    return incident.get("model") or {}, outcomes


def run_trials(server: VllmServer, reader: Callable[[], Any], scenario: Scenario, trials: Sequence[Trial],
               hold_s: float, pack: list, objectives: Objectives = Objectives(), say: Say = lambda _m: None,
               wait_stored: Callable[[int], None] = lambda _t: None, restore: bool = True) -> TrialsReport:
    """The baseline load, the model's ranked predictions, then one restart and the same load per trial.

    `reader()` opens the sidecar's store for reading; `wait_stored(ms)` returns once it holds samples
    through that time. With `restore`, the server is restarted with its first configuration at the end."""
    if hold_s * 1000 < RAMP_MS + MIN_STEADY_MS:
        raise ValueError(f"a {hold_s:g} s load leaves under {MIN_STEADY_MS // 1000} s past its {RAMP_MS // 1000} s ramp "
                         f"to measure: hold it {(RAMP_MS + MIN_STEADY_MS) // 1000} s or longer")
    first = server.config
    unknown = [t.flag for t in trials if t.flag not in FLAG_FIELDS]
    if unknown:
        raise ValueError(f"trial flags {unknown} are not flags the demo server takes; use {sorted(FLAG_FIELDS)}")
    instance = server.instance
    say(f"trials: the load as configured for {hold_s:.0f} s")
    baseline_reruns = 0
    while True:
        base = scenario(server, hold_s)
        baseline = steady_window(base, hold_s)
        say(f"trials: the load's clients saw {traffic_seen(base)}")
        wait_stored(base.end_ms)
        store = reader()
        model, outcomes = predict(store, instance, baseline, trials, dataclasses.asdict(first), objectives)
        if baseline_reruns or not lost_its_core(model.get("worker_busy")):
            break
        baseline_reruns += 1
        say(f"trials: vLLM's worker ran {model['worker_busy']:.0%} of a core in that window; the load once more")
    measured = measured_window(store, instance, baseline).measured.as_dict()
    say(f"trials: model {'withheld: ' + model['withheld'] if model.get('withheld') else 'calibrated'}")
    base_goodput = None
    try:
        for o in outcomes:
            say(f"trials: restarting with {o.trial.label} (ranked {o.rank or '-'}), the same load for {hold_s:.0f} s")
            server.restart(dataclasses.replace(first, **{FLAG_FIELDS[o.trial.flag]: o.trial.value}))
            while True:
                run = scenario(server, hold_s)
                o.window = steady_window(run, hold_s)
                o.clients = traffic_seen(run)
                say(f"trials: the load's clients saw {o.clients}")
                wait_stored(run.end_ms)
                store = reader()
                seen = measured_window(store, instance, o.window)
                o.worker_busy = seen.worker_busy()  # the demo's servers are vLLM's CPU backend
                if o.reruns or not lost_its_core(o.worker_busy):
                    break
                o.reruns += 1
                say(f"trials: vLLM's worker ran {o.worker_busy:.0%} of a core in that window; the load once more")
            o.measured = seen.measured.as_dict()
            speed = window_speed(store, instance, o.window, seen, model)
            if speed is not None:
                o.step_speed = speed.as_dict()
                if speed.changed:
                    o.unjudged = speed.reason("this trial's window")
                    say(f"trials: {o.unjudged}")
            if o.predicted is not None:
                judge_trial(o, seen.measured)
            cmp = compare(store_source(store, pack_window_evaluator(pack)),
                          CompareRequest((baseline[0], o.window[1]), instance, before=baseline, after=o.window,
                                         interval_ms=COMPARE_INTERVAL_MS, ttft_slo_s=objectives.ttft_p95_s,
                                         tpot_slo_s=objectives.tpot_p95_s))
            o.goodput_rps, o.verdict = cmp["slo"]["goodput_rps"]["after"], cmp["verdict"]
            o.compare = {k: v for k, v in cmp.items() if k != "intervals"}
            base_goodput = cmp["slo"]["goodput_rps"]["before"]
    finally:
        if restore:
            say("trials: restarting the server as it was configured")
            server.restart(first)
    return TrialsReport(baseline, measured, base_goodput, model, outcomes, baseline_reruns)


def window_speed(store: Any, instance: str, window: tuple[int, int], seen: Workload,
                 model: dict[str, Any]) -> StepSpeed | None:
    """The window's step speed against the baseline's fitted step time; None without either, or where the window's
    configuration cannot be modelled."""
    found = store_configs(store, *window)(instance)
    if found is None or not model.get("step_time"):
        return None
    try:
        return step_speed(step_time_of(model["step_time"]), seen, engine_config(found[0]))
    except Unrepresentable:
        return None


def judge_trial(o: TrialOutcome, seen: Measured) -> None:
    """The prediction's error on each judged figure, and those past the bound, by the calibration's own judge:
    a predicted p95 the buckets cannot tell from the measured p90..p99 passes with a note. An unjudged outcome
    keeps its errors and has nothing past the bound."""
    modelled = {k: _predicted(o.predicted or {}, k) for k in JUDGED}
    measured = seen.as_dict()
    o.error = {k: relative_error(modelled[k], measured.get(k), ERROR_FLOORS[k]) for k in JUDGED}
    over, notes = judge(o.error, modelled, seen)
    if o.unjudged is None:
        o.over, o.notes = [k for k, _e in over], notes


def steady_window(run: ScenarioRun, hold_s: float) -> tuple[int, int]:
    """The stretch of a load where every client kept a request in the server: past its ramp, before its clients
    stopped sending (the drain after it has an emptying queue, which the model replays as a different load)."""
    start = run.phase("load")
    return start + RAMP_MS, start + int(hold_s * 1000)


def sidecar_stored_through(sidecar: Any, t_ms: int, timeout_s: float = 120.0) -> None:
    """Wait (at most timeout_s) until an in-process sidecar stored every target's scrapes through t_ms and its
    write queue is empty: on a starved 2-core host its writer can lag behind the scrapes. TimeoutError past it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        doc = sidecar.status()
        targets = [c for c in doc.get("collectors", []) if c["name"].startswith("vllm ")]
        if targets and all((c.get("last_ms") or 0) >= t_ms for c in targets) and doc.get("queue") == 0:
            time.sleep(1)  # the writer's last gather and commit
            return
        time.sleep(0.5)
    raise TimeoutError(f"the sidecar had not stored its scrapes through {iso_seconds(t_ms)} after {timeout_s:.0f} s")


def _predicted(p: dict[str, Any], key: str) -> float | None:
    # a fix's prediction names throughput `throughput_tps`; the model's reading names it by vLLM's counter
    return p.get("throughput_tps") if key == "generation_tokens_per_s" else p.get(key)
