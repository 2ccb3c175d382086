"""prefix_cache_ineffective end to end: the shipped rule over a real store, its evidence, and its two fixes."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.diagnosis.diagnose import diagnose
from vllm_sentinel.agent.diagnosis.fixes import compute
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch

T0 = 1_795_946_400_000
MINUTES = 30
CACHE = {"block_size": "16", "num_gpu_blocks": "20000", "enable_prefix_caching": "True", "engine": "0",
         "gpu_memory_utilization": "0.9", "kv_cache_memory_bytes": "None"}


def store_with(tmp_path: Path, instances: list[str], hits_per_s: float) -> Store:
    """Scrapes every 15 s of replicas of model m: 400 prompt and 40 generated tokens/s each, caching on."""
    store = Store.open(tmp_path / "s.duckdb")
    batches = []
    for k in range(0, MINUTES * 60, 15):
        for inst in instances:
            b = Batch(instance=inst, ts_ms=T0 + k * 1000)
            labels = {"engine": "0", "model_name": "m"}
            b.add("vllm:prefix_cache_queries_total", labels, 400.0 * k)
            b.add("vllm:prefix_cache_hits_total", labels, hits_per_s * k)
            b.add("vllm:prompt_tokens_total", labels, 400.0 * k)
            b.add("vllm:generation_tokens_total", labels, 40.0 * k)
            b.add("vllm:num_requests_running", labels, 3.0)
            b.add("vllm:cache_config_info", CACHE, 1.0)
            batches.append(b)
    store.append_many(batches)
    return store


def prefix_incidents(store: Store) -> list[dict]:
    doc = diagnose(store, T0, T0 + MINUTES * 60_000, None, evaluate_window=pack_window_evaluator(load_pack()))
    return [i for i in doc["incidents"] if i["incident"] == "prefix_cache_ineffective"]


def test_two_replicas_hitting_5_percent_get_caching_off_and_prefix_routing(tmp_path: Path) -> None:
    with store_with(tmp_path, ["a:8000", "b:8000"], hits_per_s=20) as store:
        found = prefix_incidents(store)
    assert sorted(i["instance"] for i in found) == ["a:8000", "b:8000"]
    inc = found[0]
    ev = {e["signal"]: e["value"] for e in inc["evidence"]}
    assert abs(ev["prefix_cache_hit_ratio"] - 0.05) < 1e-9 and abs(ev["prompt_to_output_ratio"] - 10) < 1e-9
    assert ev["replicas"] == 2
    fixes = {f["param"]: f for f in inc["fixes"]}
    assert fixes["--enable-prefix-caching"]["suggested"].startswith("false")
    assert "5.0% of the prompt tokens looked up" in fixes["--enable-prefix-caching"]["why"]
    assert "prompts are 10 tokens per generated token" in fixes["--enable-prefix-caching"]["why"]
    assert fixes["router policy"]["suggested"].startswith("prefix-aware routing")
    assert "up to 2 misses per prefix" in fixes["router policy"]["why"]


def test_one_replica_gets_no_routing_advice_and_a_paying_cache_no_incident(tmp_path: Path) -> None:
    for name in ("one", "paying"):
        (tmp_path / name).mkdir()
    with store_with(tmp_path / "one", ["a:8000"], hits_per_s=20) as store:
        [inc] = prefix_incidents(store)
    assert [f["param"] for f in inc["fixes"]] == ["--enable-prefix-caching"]
    with store_with(tmp_path / "paying", ["a:8000"], hits_per_s=200) as store:  # half the prompt is cached
        assert prefix_incidents(store) == []


def test_without_the_hit_ratio_the_fix_names_the_missing_evidence() -> None:
    f = compute("prefix_cache_ineffective", {"enable_prefix_caching": True}, {"replicas": 2})
    assert f.suggested is None and "prefix_cache_hit_ratio" in f.why
    assert compute("prefix_cache_ineffective", {"enable_prefix_caching": False}, {"prefix_cache_hit_ratio": 0.01}) \
        is None
