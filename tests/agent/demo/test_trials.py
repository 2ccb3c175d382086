"""The restart trials measure each load where every client kept a request in the server, run a load again
whose window the host took vLLM's CPU in, and judge no prediction by a window whose steps ran at another speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.demo.scenarios import ScenarioRun
from vllm_sentinel.agent.demo.trials import RAMP_MS, Trial, run_trials, steady_window
from vllm_sentinel.agent.demo.verify import FLAG_FIELDS
from vllm_sentinel.agent.demo.vllm_server import VllmServerConfig
from vllm_sentinel.agent.diagnosis.sim_calibrate import CONTENDED_BELOW
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.timefmt import parse_time_ms
from tests.agent.diagnosis.test_whatif import worker_slowed


def test_the_measured_window_skips_the_ramp_and_the_drain() -> None:
    run = ScenarioRun("kv_cache_pressure", "kv_cache_pressure", start_ms=1_000, end_ms=95_000,
                      phases=[("load", 1_200), ("settle", 90_000)])
    # the clients stopped sending at 61.2 s; the last requests drained until 90 s and the scenario settled after
    assert steady_window(run, 60) == (1_200 + RAMP_MS, 61_200)


def test_a_load_too_short_to_measure_is_refused_before_any_restart() -> None:
    with pytest.raises(ValueError, match="hold it 35 s or longer"):
        run_trials(server=None, reader=lambda: None, scenario=None, trials=[], hold_s=30, pack=[])  # type: ignore[arg-type]


class _Server:
    """A server whose restarts are only counted: the loads below are windows of the recorded session."""

    def __init__(self, instance: str, **config: int) -> None:
        self.instance, self.restarts = instance, []
        self.config = VllmServerConfig(Path("/model"), **{"max_num_seqs": 4, **config})

    def restart(self, config: VllmServerConfig) -> None:
        self.restarts.append(config)


def test_a_load_whose_worker_lost_its_core_runs_once_more(recorded_db: tuple, tmp_path: Path) -> None:
    """The recorded kv load in three 36 s windows, the worker's CPU halved in the first and the third: the baseline
    is run again and calibrated on the second window; the trial's load is run again once, not until it is
    uncontended, and says how it ran."""
    meta = load_metadata(default_recording())
    load = next(s for s in meta["scenarios"] if s["name"] == "kv_cache_pressure")["phases"][0][1]
    windows = [(load + 36_000 * k, load + 36_000 * (k + 1)) for k in range(3)]
    slowed = worker_slowed(tmp_path, [windows[0], windows[2]], 0.5)
    runs = iter([windows[0], windows[1], windows[2], windows[2]])

    def scenario(_server: object, _hold: float) -> ScenarioRun:
        start, end = next(runs)
        return ScenarioRun("kv_cache_pressure", "kv_cache_pressure", start - RAMP_MS, end, [("load", start - RAMP_MS)])

    server, said = _Server(meta["instance"]), []
    with Store.open(slowed, read_only=True) as store:
        report = run_trials(server, lambda: store, scenario, [Trial("--max-num-seqs", 6)], 46, load_pack(),  # type: ignore[arg-type]
                            say=said.append, restore=False)
    assert report.baseline_reruns == 1 and report.baseline == windows[1], said
    assert report.model["worker_busy"] >= CONTENDED_BELOW, report.model
    (o,) = report.outcomes
    assert o.reruns == 1 and o.window == windows[2] and o.worker_busy < CONTENDED_BELOW, o.as_dict()
    assert [c.max_num_seqs for c in server.restarts] == [6]
    assert sum("the load once more" in line for line in said) == 2, said


def test_windows_whose_steps_ran_at_another_speed_judge_neither_prediction_nor_ranking(ci_host_db: tuple) -> None:
    """The project's CI host, recorded (tests/agent/fixtures/restarts): the kv load on 8 blocks, then restarts with
    19 blocks, --max-num-seqs 3 and 8. The same work a step took 2.6 ms in the --max-num-seqs 3 window and 4.1 ms
    in the baseline's, the worker holding its core in both: the host's speed, not the configuration's. Those
    windows show their measurement beside the prediction without judging it, and the one whose steps ran at the
    model's speed is judged (within the bound) and is the only one the ranking may be measured by."""
    path, meta = ci_host_db
    windows = {k: (parse_time_ms(a), parse_time_ms(b)) for k, (a, b) in meta["windows"].items()}
    trials = [Trial("--num-gpu-blocks-override", 19), Trial("--max-num-seqs", 3), Trial("--max-num-seqs", 8)]
    server = _Server(meta["instance"], num_gpu_blocks_override=8)

    def scenario(srv: _Server, hold: float) -> ScenarioRun:
        label = next((t.label for t in trials if srv.restarts and
                      getattr(srv.restarts[-1], FLAG_FIELDS[t.flag]) == t.value
                      and getattr(srv.config, FLAG_FIELDS[t.flag]) != t.value), "baseline")
        start, end = windows[label]
        return ScenarioRun("kv_cache_pressure", "kv_cache_pressure", start - RAMP_MS, end, [("load", start - RAMP_MS)])

    said: list[str] = []
    with Store.open(path, read_only=True) as store:
        report = run_trials(server, lambda: store, scenario, trials, 50, load_pack(),  # type: ignore[arg-type]
                            say=said.append, restore=False)
    assert report.baseline == windows["baseline"] and report.model.get("withheld") is None, report.model
    by = {o.trial.label: o for o in report.outcomes}
    assert [o.window for o in report.outcomes] == [windows[o.trial.label] for o in report.outcomes]
    fast, slow, same = by["--max-num-seqs 3"], by["--num-gpu-blocks-override 19"], by["--max-num-seqs 8"]
    # predicted 559 generated tokens/s, measured 863: 35 % off, all of it the steps' speed
    assert fast.step_speed["ratio"] < 0.8 and "faster, past the 20% bound" in fast.unjudged, fast.as_dict()
    assert fast.error["generation_tokens_per_s"] > 0.3 and fast.over == [] and not fast.comparable
    assert slow.step_speed["ratio"] > 1.2 and "slower" in slow.unjudged and not slow.comparable, slow.as_dict()
    # the model's replay of each window at that window's own step time: the scheduling and the KV blocks held
    for o in report.outcomes:
        assert o.step_speed["replay_error"]["generation_tokens_per_s"] <= 0.3, o.as_dict()
    assert same.unjudged is None and same.comparable and same.over == [], same.as_dict()
    assert same.error["generation_tokens_per_s"] <= 0.3, same.as_dict()
    assert report.measured_best() is same
    assert sum("past the 20% bound" in line for line in said) == 2, said
