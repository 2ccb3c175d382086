"""The autoscaling signal: the live evaluator's open incidents -> replicas per model, by the replica fix's arithmetic.

The recorded real session (reports/recordings/, 4 sequence slots, 8 KV blocks) is replayed through the
live Evaluator step by step, as the daemon does every few seconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata, replay_into
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.fixes import compute
from vllm_sentinel.agent.diagnosis.incidents import Evaluator
from vllm_sentinel.agent.diagnosis.replica_signal import REASON_NONE, current_replicas, desired_replicas
from vllm_sentinel.agent.store.db import Store

STEP_MS = 5_000
# 8 blocks x 128 tokens, max_model_len 512, 4 sequence slots: the recorded server's configuration
CFG = {"num_gpu_blocks": 8, "block_size": 128, "max_model_len": 512, "max_num_seqs": 4}


def incident(kind: str, model: str, **evidence: float) -> SimpleNamespace:
    labels = {"incident": kind, "model_name": model, "instance": f"{model}-0:8000"}
    return SimpleNamespace(labels=labels, id=f"{kind}-{model}",
                           evidence=[{"signal": k, "value": v} for k, v in evidence.items()])


def no_config(_instance: str | None) -> dict:
    return CFG


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> tuple[dict, list[tuple[int, dict, list[dict]]]]:
    """The signal and the open incidents after each live evaluation step, healthy start to KV pressure's end."""
    recording = default_recording()
    meta = load_metadata(recording)
    kv = next(s for s in meta["scenarios"] if s["name"] == "kv_cache_pressure")
    steps = []
    with Store.open(tmp_path_factory.mktemp("rep") / "s.duckdb") as store:
        replay_into(store, recording)  # the samples, and the server's configuration snapshots
        evaluator = Evaluator(load_pack(), config_for=lambda inst: liveconfig.load_snapshot_at(store, inst, t) or {})
        for t in range(meta["start_ms"] // STEP_MS * STEP_MS, kv["end_ms"], STEP_MS):
            evaluator(store, t)
            current = current_replicas(evaluator.instant, t)
            steps.append((t, desired_replicas(evaluator.open.values(), current, evaluator.config_for),
                          [i.as_dict() for i in evaluator.open.values()]))
    return meta, steps


def test_a_need_is_the_asking_incidents_own_replica_fix(replayed) -> None:
    _meta, steps = replayed
    asked = [(d["tiny-llama"], incs) for _t, d, incs in steps if d and d["tiny-llama"].reason != REASON_NONE]
    assert asked, "no step of the session asked for replicas"
    for need, incs in asked:
        # the number and the arithmetic are the ones diagnose shows in the incident's `replicas` fix
        inc = next(i for i in incs if i["id"] == need.incident_id)
        fix = next(f for f in inc["fixes"] if f["param"] == "replicas")
        assert need.replicas == int(fix["suggested"]) > 1 and need.why == fix["why"]


def test_while_the_kv_cache_has_room_the_queue_asks_for_sequences_not_replicas(replayed) -> None:
    meta, steps = replayed
    queue = next(s for s in meta["scenarios"] if s["name"] == "queue_blocking")
    during = [(d, incs) for t, d, incs in steps if queue["start_ms"] <= t <= queue["end_ms"]
              and any(i["incident"] == "queue_blocking" for i in incs)]
    assert during, "queue_blocking never fired in its scenario"
    for d, incs in during:
        fixes = next(i["fixes"] for i in incs if i["incident"] == "queue_blocking")
        if any(f["param"] == "--max-num-seqs" and f["suggested"] for f in fixes):
            assert (d["tiny-llama"].replicas, d["tiny-llama"].reason) == (1, REASON_NONE)


def test_the_healthy_start_holds_the_current_replica_count(replayed) -> None:
    meta, steps = replayed
    healthy = next(s for s in meta["scenarios"] if s["name"] == "healthy")
    early = [d for t, d, _ in steps if healthy["start_ms"] + 30_000 <= t <= healthy["end_ms"]]
    assert early and all(d == {"tiny-llama": d["tiny-llama"]} and d["tiny-llama"].replicas == 1
                         and d["tiny-llama"].reason == REASON_NONE for d in early)


def test_the_largest_need_wins_and_a_model_without_one_keeps_its_replicas() -> None:
    # queue: demand 4 running + 8 waiting = 12 over 3 sequences per replica (KV: 1,024 x 0.9 / (100 + 100 + 64))
    q = incident("queue_blocking", "a", waiting=8, running=4, replicas=2, mean_prompt_tokens=100,
                 mean_generation_tokens=100)
    expected = compute("queue_blocking.replicas", CFG, {e["signal"]: e["value"] for e in q.evidence})
    kv = incident("kv_cache_pressure", "a", waiting=1, running=3, mean_prompt_tokens=100, mean_generation_tokens=100)
    out = desired_replicas([kv, q], {"a": 2, "b": 3}, no_config)
    assert out["a"].replicas == int(expected.suggested) == 4 and out["a"].reason == "queue"
    assert out["a"].incident_id == "queue_blocking-a"
    assert (out["b"].replicas, out["b"].reason, out["b"].incident_id) == (3, REASON_NONE, None)


def test_kv_pressure_counts_the_replicas_it_sees_when_its_rule_has_no_replicas_signal() -> None:
    kv = incident("kv_cache_pressure", "a", waiting=6, running=3, mean_prompt_tokens=100, mean_generation_tokens=100)
    out = desired_replicas([kv], {"a": 2}, no_config)
    # (3 + 6) / 3 sequences per replica = 3, and at least one more than the 2 serving now
    assert (out["a"].replicas, out["a"].reason) == (3, "kv_pressure")


def test_kv_room_means_more_sequences_first_and_no_replica_is_asked() -> None:
    # short requests: many more than 4 sequences fit, so raising --max-num-seqs is the fix, not replicas
    q = incident("queue_blocking", "a", waiting=8, running=4, replicas=1, mean_prompt_tokens=10,
                 mean_generation_tokens=10)
    out = desired_replicas([q], {"a": 1}, no_config)
    assert (out["a"].replicas, out["a"].reason) == (1, REASON_NONE)


def test_missing_inputs_ask_for_nothing_and_a_model_is_never_0() -> None:
    q = incident("ttft_slo_breach", "a", running=2)  # no waiting signal: the fix cannot compute
    out = desired_replicas([q, incident("engine_stall", "a")], {"a": 0}, lambda _i: {})
    assert (out["a"].replicas, out["a"].reason) == (1, REASON_NONE)


def test_a_tie_names_the_queue_before_the_ttft_objective() -> None:
    ev = dict(waiting=8, running=4, replicas=1, mean_prompt_tokens=100, mean_generation_tokens=100)
    out = desired_replicas([incident("ttft_slo_breach", "a", **ev), incident("queue_blocking", "a", **ev)],
                           {"a": 1}, no_config)
    assert out["a"].reason == "queue"
