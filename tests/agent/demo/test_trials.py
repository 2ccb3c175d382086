"""The restart trials measure each load where every client kept a request in the server, and run a load again
whose window the host took vLLM's CPU in."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.demo.scenarios import ScenarioRun
from vllm_sentinel.agent.demo.trials import RAMP_MS, Trial, run_trials, steady_window
from vllm_sentinel.agent.demo.vllm_server import VllmServerConfig
from vllm_sentinel.agent.diagnosis.sim_calibrate import CONTENDED_BELOW
from vllm_sentinel.agent.store.db import Store
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

    def __init__(self, instance: str) -> None:
        self.instance, self.config, self.restarts = instance, VllmServerConfig(Path("/model"), max_num_seqs=4), []

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
