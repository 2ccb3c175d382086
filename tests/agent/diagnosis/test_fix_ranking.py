"""Fixes predicted by the what-if model and ranked by goodput, on the recorded real session."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.diagnosis.diagnose import diagnose
from vllm_sentinel.agent.diagnosis.fix_ranking import Objectives, pack_objectives, scenario_of, trade
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.store.db import Store


@pytest.fixture(scope="module")
def diagnosed(recorded_db: tuple) -> dict:
    path, first, last = recorded_db
    with Store.open(path, read_only=True) as store:
        return diagnose(store, first - 1, last, evaluate_window=pack_window_evaluator(load_pack()))


def test_the_kv_fix_that_keeps_the_batch_ranks_first_and_the_one_that_shrinks_it_is_a_trade(diagnosed: dict) -> None:
    kv = next(i for i in diagnosed["incidents"] if i["incident"] == "kv_cache_pressure")
    model = kv["model"]
    assert model["withheld"] is None and all(e <= 0.3 for e in model["calibration_error"].values()), model
    first = kv["fixes"][0]
    assert (first["param"], first["current"], first["rank"]) == ("--num-gpu-blocks-override", "8", 1)
    assert first["predicted"]["preemptions_per_s"] == 0 and first["predicted"]["trade"] is None
    seqs = next(f for f in kv["fixes"] if f["param"] == "--max-num-seqs")
    assert seqs["rank"] > 1 and seqs["predicted"]["goodput_rps"] < first["predicted"]["goodput_rps"]
    # one sequence at a time stops the preemptions and pays in TTFT: said as a trade
    assert seqs["predicted"]["trade"].startswith("preemptions/s") and "bought with TTFT p95" in seqs["predicted"]["trade"]
    goodputs = [f["predicted"]["goodput_rps"] for f in kv["fixes"] if "predicted" in f]
    assert goodputs == sorted(goodputs, reverse=True)


def test_an_incident_the_model_cannot_replay_keeps_its_rule_order_and_says_why(diagnosed: dict) -> None:
    queue = next(i for i in diagnosed["incidents"] if i["incident"] == "queue_blocking")
    assert queue["model"]["withheld"] and "off by" in queue["model"]["withheld"]
    assert all("predicted" not in f and "rank" not in f for f in queue["fixes"])
    stall = next(i for i in diagnosed["incidents"] if i["incident"] == "engine_stall")
    assert "model" not in stall  # no fix the model represents (a timeout, a restart)


def test_scenarios_trades_and_objectives() -> None:
    assert scenario_of({"param": "--max-num-seqs", "suggested": "2"}) == ((("max-num-seqs", "2"),), 1)
    assert scenario_of({"param": "replicas", "suggested": "3"}) == ((), 3)
    assert scenario_of({"param": "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "suggested": "60"}) is None
    assert scenario_of({"param": "--max-num-seqs", "suggested": None}) is None
    before = {"ttft_p95_s": 4.7, "itl_p95_s": 0.01, "preemptions_per_s": 0.7, "generation_tokens_per_s": 190}
    assert trade(before, {**before, "preemptions_per_s": 0, "ttft_p95_s": 73}) == \
        "preemptions/s 0.7 → 0 bought with TTFT p95 4.7 → 73"
    assert trade(before, {**before, "preemptions_per_s": 0, "ttft_p95_s": 0.6}) is None  # better all round
    assert trade(before, {**before, "ttft_p95_s": 4.9}) is None  # under 10 %: no change
    # five replicas of a closed loop (the demo's traffic_burst): five times the requests, as many preemptions each
    one = {"ttft_p95_s": 2.42, "preemptions_per_s": 4.12, "generation_tokens_per_s": 889, "requests_per_s": 4.4}
    five = {"ttft_p95_s": 0.152, "preemptions_per_s": 20.6, "generation_tokens_per_s": 4443, "requests_per_s": 22.1}
    assert trade(one, five) is None
    assert trade(one, {**five, "preemptions_per_s": 40.0}) == (
        "TTFT p95 2.42 → 0.152, tokens/s 889 → 4.44e+03 bought with preemptions per request 0.936 → 1.81")
    assert pack_objectives(load_pack()) == Objectives(2.0, 0.1) == pack_objectives(None)


def test_a_stored_incidents_report_ranks_its_fixes_and_shows_the_trade(recorded_db: tuple) -> None:
    """A report of a stored incident (no diagnose before it) predicts and ranks its fixes itself."""
    from vllm_sentinel.reports.assemble import assemble_incident
    from vllm_sentinel.reports.markdown import render_markdown

    path, first, last = recorded_db
    with Store.open(path, read_only=True) as store:
        doc = diagnose(store, first - 1, last, evaluate_window=pack_window_evaluator(load_pack()))
        kv = next(i for i in doc["incidents"] if i["incident"] == "kv_cache_pressure")
        bare = {**kv, "fixes": [{k: v for k, v in f.items() if k not in ("predicted", "rank")} for f in kv["fixes"]]}
        bare.pop("model")
        bare["fixes"].reverse()  # the rule's order no longer matters: the report ranks them again
        data = assemble_incident(store, bare, now_ms=last, rules=load_pack())
    assert [f["param"] for f in data.fixes] == [f["param"] for f in kv["fixes"]]
    text = render_markdown(data)
    assert "Ranked by the goodput the what-if model predicts" in text
    assert "a trade: preemptions/s" in text and "&gt;" not in text.split("## Suggested fix")[1].split("##")[0]
