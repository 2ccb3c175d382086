"""compare's prediction block on the recorded real session: the model calibrated on the before window alone,
asked for the after window's configuration, judged against what the after window measured.

The session has no restart; each test copies it and records a second configuration snapshot halfway through
kv_cache_pressure (12 clients of 200+200 tokens on 8 blocks of 128, preempting), so both windows hold the
same traffic on a server that in truth never changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.compare import CompareRequest, compare
from vllm_sentinel.agent.diagnosis.compare_prediction import _sets
from vllm_sentinel.agent.diagnosis.compare_sources import store_source
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.timefmt import parse_time_ms
from tests.agent.diagnosis.test_whatif import worker_slowed


@pytest.fixture(scope="module")
def kv_halves(recorded_db: tuple) -> dict:
    """The recorded session, its instance, and kv_cache_pressure's load split in two equal windows."""
    meta = load_metadata(default_recording())
    load = next(s for s in meta["scenarios"] if s["name"] == "kv_cache_pressure")
    start, settle = load["phases"][0][1], load["phases"][1][1]
    mid = (start + settle) // 2
    return {"path": recorded_db[0], "instance": meta["config_snapshots"][0]["instance"],
            "before": (start + 10_000, mid), "after": (mid, settle), "span": recorded_db[1:]}


def compared(kv_halves: dict, tmp_path: Path, source: Path | None = None, **changed: object) -> dict:
    """compare over the two halves (of a copy of `source`, the recording's store by default), with the
    configuration changed as given from the second half on."""
    path = tmp_path / "changed.duckdb"
    path.write_bytes(Path(source or kv_halves["path"]).read_bytes())
    with Store.open(path) as store:
        cfg = liveconfig.load_snapshot_at(store, kv_halves["instance"], kv_halves["after"][0])
        assert cfg is not None
        cfg.values.update(changed)
        assert liveconfig.save_snapshot(store, cfg, kv_halves["after"][0])
    with Store.open(path, read_only=True) as store:
        return compare(store_source(store, pack_window_evaluator(load_pack())),
                       CompareRequest(kv_halves["span"], before=kv_halves["before"], after=kv_halves["after"]))


def rows(doc: dict) -> dict[str, dict]:
    return {r["key"]: r for r in doc["prediction"]["rows"]}


def test_a_change_the_model_says_buys_nothing_is_predicted_within_the_bound(kv_halves: dict, tmp_path: Path) -> None:
    # the KV blocks bind at 4 sequences: allowing 6 changes nothing, as the unchanged server measured
    doc = compared(kv_halves, tmp_path, max_num_seqs=6)
    p = doc["prediction"]
    assert p["withheld"] is None and p["changes"] == ["--max-num-seqs 4 -> 6"], p
    assert p["within_bound"] is True and p["over"] == [], p
    tokens = rows(doc)["generation_tokens_per_s"]
    assert tokens["measured"] == pytest.approx(tokens["predicted"], rel=0.3), tokens
    assert rows(doc)["goodput_rps"]["measured"] == doc["slo"]["goodput_rps"]["after"]


def test_a_prediction_the_server_did_not_meet_is_outside_the_bound(kv_halves: dict, tmp_path: Path) -> None:
    # ten times the blocks: the model predicts preemptions gone and throughput up; the server, unchanged, did not
    doc = compared(kv_halves, tmp_path, num_gpu_blocks=80, num_gpu_blocks_override=80, kv_cache_size_tokens=10240)
    p = doc["prediction"]
    assert p["withheld"] is None and p["changes"] == ["--num-gpu-blocks-override 8 -> 80"], p
    assert p["within_bound"] is False and "preemptions_per_s" in p["over"], p
    assert rows(doc)["preemptions_per_s"]["predicted"] == 0 < rows(doc)["preemptions_per_s"]["measured"]


def test_an_after_window_whose_worker_lost_its_core_cannot_judge_the_prediction(kv_halves: dict,
                                                                                  tmp_path: Path) -> None:
    """The CPU backend's worker ran half its pace after the change: other work had its core, so what the after window
    measured is that contention's. The prediction is withheld, saying which window; the before window's reading
    (91 % of a core) is shown beside it."""
    slowed = worker_slowed(tmp_path, [(kv_halves["after"][0], kv_halves["after"][1] + 10_000)], 0.5)
    doc = compared(kv_halves, tmp_path, source=slowed, max_num_seqs=6)
    p = doc["prediction"]
    assert p["worker_busy"]["after"] == pytest.approx(0.45, abs=0.05) and p["rows"] == [], p
    assert f"worker ran {p['worker_busy']['after']:.0%} of a core in the after window" in p["withheld"], p
    assert compared(kv_halves, tmp_path, max_num_seqs=6)["prediction"]["worker_busy"]["before"] == \
        pytest.approx(0.91, abs=0.05)


def test_a_change_the_model_cannot_represent_withholds_it_by_name(kv_halves: dict, tmp_path: Path) -> None:
    doc = compared(kv_halves, tmp_path, model_dtype="float16", max_num_seqs=6)
    p = doc["prediction"]
    assert p["withheld"].startswith("the model does not represent a change of model_dtype"), p
    assert p["rows"] == [] and p["within_bound"] is None


def test_no_configuration_change_has_no_prediction(kv_halves: dict) -> None:
    with Store.open(kv_halves["path"], read_only=True) as store:
        doc = compare(store_source(store, pack_window_evaluator(load_pack())),
                      CompareRequest(kv_halves["span"], before=kv_halves["before"], after=kv_halves["after"]))
    assert doc["config_changes"] == [] and doc["prediction"] is None


def test_other_traffic_after_the_change_withholds_the_prediction(recorded_db: tuple, tmp_path: Path) -> None:
    # queue_blocking's 12+100-token requests before, kv_cache_pressure's 200+200 after: not the load predicted
    meta = load_metadata(default_recording())
    phases = {s["name"]: (s["start_ms"], s["end_ms"]) for s in meta["scenarios"]}
    halves = {"path": recorded_db[0], "instance": meta["config_snapshots"][0]["instance"],
              "before": phases["queue_blocking"], "after": phases["kv_cache_pressure"], "span": recorded_db[1:]}
    p = compared(halves, tmp_path, max_num_seqs=6)["prediction"]
    assert p["withheld"].startswith("the prompts changed from"), p
    assert "the model replays the before window's traffic" in p["withheld"]


def test_memory_settings_count_through_the_block_count_the_engine_reports() -> None:
    changes = [{"param": "--gpu-memory-utilization", "before": "0.9", "after": "0.95"},
               {"param": "num_gpu_blocks", "before": "9000", "after": "12000"},
               {"param": "kv_cache_size_tokens", "before": "144000", "after": "192000"}]
    assert _sets(changes) == ([("num-gpu-blocks", "12000")], [])
    assert _sets(changes[:1]) == ([], ["--gpu-memory-utilization"])  # without the engine's count: not modelled


def _ci_host_compare(ci_host_db: tuple, trial: str) -> dict:
    """compare over the CI host's baseline window and one restart's (tests/agent/fixtures/restarts)."""
    path, meta = ci_host_db
    before, after = ((parse_time_ms(a), parse_time_ms(b)) for a, b in (meta["windows"]["baseline"],
                                                                        meta["windows"][trial]))
    with Store.open(path, read_only=True) as store:
        return compare(store_source(store, pack_window_evaluator(load_pack())),
                       CompareRequest((before[0], after[1]), meta["instance"], before=before, after=after))


def test_an_after_window_whose_steps_ran_faster_shows_the_prediction_unjudged(ci_host_db: tuple) -> None:
    """On the CI host the --max-num-seqs 3 window's steps took 2.65 ms for the work the baseline's took 4.05 ms in:
    the prediction (559 tokens/s) is shown beside the measurement (863) with the reason it is not judged, and the
    model's replay of the after window at its own step time says the rest of the model held."""
    p = _ci_host_compare(ci_host_db, "--max-num-seqs 3")["prediction"]
    assert p["withheld"] is None and p["changes"] == ["--max-num-seqs 4 -> 3"], p
    assert p["step_speed"]["changed"] and p["step_speed"]["ratio"] < 0.8, p["step_speed"]
    assert "faster, past the 20% bound" in p["unjudged"] and p["within_bound"] is None and p["over"] == [], p
    tokens = {r["key"]: r for r in p["rows"]}["generation_tokens_per_s"]
    assert tokens["error"] > 0.3, tokens  # what would have failed the bound
    assert p["step_speed"]["replay_error"]["generation_tokens_per_s"] <= 0.3, p["step_speed"]


def test_an_after_window_at_the_models_speed_judges_the_prediction(ci_host_db: tuple) -> None:
    """--max-num-seqs 8 on the same host: its steps ran within the bound of the model's speed, so the prediction is
    judged, and held (the 8 blocks bind as at 4 sequences)."""
    p = _ci_host_compare(ci_host_db, "--max-num-seqs 8")["prediction"]
    assert not p["step_speed"]["changed"] and p["unjudged"] is None, p
    assert p["within_bound"] is True and p["over"] == [], p
