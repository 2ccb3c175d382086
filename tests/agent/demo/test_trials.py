"""The restart trials measure each load where every client kept a request in the server."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.demo.scenarios import ScenarioRun
from vllm_sentinel.agent.demo.trials import RAMP_MS, run_trials, steady_window


def test_the_measured_window_skips_the_ramp_and_the_drain() -> None:
    run = ScenarioRun("kv_cache_pressure", "kv_cache_pressure", start_ms=1_000, end_ms=95_000,
                      phases=[("load", 1_200), ("settle", 90_000)])
    # the clients stopped sending at 61.2 s; the last requests drained until 90 s and the scenario settled after
    assert steady_window(run, 60) == (1_200 + RAMP_MS, 61_200)


def test_a_load_too_short_to_measure_is_refused_before_any_restart() -> None:
    with pytest.raises(ValueError, match="hold it 35 s or longer"):
        run_trials(server=None, reader=lambda: None, scenario=None, trials=[], hold_s=30, pack=[])  # type: ignore[arg-type]
