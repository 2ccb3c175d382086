"""The configuration the metrics show when no command line is known: cache info, --max-num-seqs from
behaviour, defaults said to be inferred."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel.agent.diagnosis.metrics_config import metrics_configs
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch

T0 = 1_795_946_400_000
CACHE = {"block_size": "128", "num_gpu_blocks": "8", "kv_cache_memory_bytes": "1073741824",
         "user_specified_block_size": "False", "kv_cache_size_tokens": "1024", "kv_cache_max_concurrency": "2.0",
         "enable_prefix_caching": "True", "engine": "0"}


def store_with(tmp_path: Path, phases: list[tuple[int, float, float, float]]) -> Store:
    """Scrapes every 5 s: (seconds, running, waiting, kv usage) held from that second on."""
    store = Store.open(tmp_path / "s.duckdb")
    batches = []
    for k in range(0, 600, 5):
        running, waiting, kv = next((r, w, u) for s, r, w, u in reversed(phases) if s <= k)
        b = Batch(instance="a:8000", ts_ms=T0 + k * 1000)
        b.add("vllm:num_requests_running", {"engine": "0", "model_name": "m"}, running)
        b.add("vllm:num_requests_waiting", {"engine": "0", "model_name": "m"}, waiting)
        b.add("vllm:kv_cache_usage_perc", {"engine": "0", "model_name": "m"}, kv)
        b.add("vllm:cache_config_info", CACHE, 1.0)
        batches.append(b)
    store.append_many(batches)
    return store


def configured(store: Store):
    return metrics_configs(Engine(store), ["a:8000"], T0 + 600_000, 5_000, T0)["a:8000"]


def test_max_num_seqs_is_the_running_peak_while_requests_waited_with_kv_room(tmp_path: Path) -> None:
    # a queue with KV room: running sits at the cap (4); then a full KV cache limits running to 2,
    # and an idle stretch runs 6 at most once without anyone waiting: neither says anything about the cap
    with store_with(tmp_path, [(0, 1, 0, 0.1), (100, 4, 3, 0.5), (300, 2, 5, 0.95), (400, 6, 0, 0.7)]) as store:
        cfg = configured(store)
    assert cfg.get("max_num_seqs") == 4
    assert cfg.source("max_num_seqs").startswith("inferred from behaviour: at most 4 requests ran")
    assert cfg.get("num_gpu_blocks") == 8 and cfg.source("num_gpu_blocks") == "cache_config_info"
    assert cfg.get("max_model_len") == 512  # kv_cache_size_tokens / kv_cache_max_concurrency


def test_without_a_queue_the_cap_falls_back_to_the_default_said_inferred(tmp_path: Path) -> None:
    with store_with(tmp_path, [(0, 2, 0, 0.3)]) as store:
        cfg = configured(store)
    assert cfg.get("platform") == "cpu"  # told by the cache info (block 128, KV bytes set, not user-chosen)
    assert cfg.get("max_num_seqs") == 128
    assert cfg.source("max_num_seqs").startswith("inferred (the command line is not in the metrics): default")
    assert cfg.source("block_size") == "cache_config_info"  # from the engine: not marked inferred


def store_by_reason(tmp_path: Path, phases: list[tuple[int, float, float, float, float]]) -> Store:
    """As store_with, on a server that splits waiting by reason: (seconds, running, capacity, deferred, kv)."""
    store = Store.open(tmp_path / "r.duckdb")
    batches = []
    for k in range(0, 600, 5):
        running, capacity, deferred, kv = next((r, c, d, u) for s, r, c, d, u in reversed(phases) if s <= k)
        b = Batch(instance="a:8000", ts_ms=T0 + k * 1000)
        labels = {"engine": "0", "model_name": "m"}
        b.add("vllm:num_requests_running", labels, running)
        b.add("vllm:num_requests_waiting", labels, capacity + deferred)  # vLLM: the sum of the reasons
        b.add("vllm:num_requests_waiting_by_reason", {**labels, "reason": "capacity"}, capacity)
        b.add("vllm:num_requests_waiting_by_reason", {**labels, "reason": "deferred"}, deferred)
        b.add("vllm:kv_cache_usage_perc", labels, kv)
        b.add("vllm:cache_config_info", CACHE, 1.0)
        batches.append(b)
    store.append_many(batches)
    return store


def test_only_requests_waiting_for_capacity_prove_the_cap(tmp_path: Path) -> None:
    # 4 run while 3 wait for a slot; later 6 run while 2 wait only deferred (a LoRA budget): 6 is not a cap
    with store_by_reason(tmp_path, [(0, 1, 0, 0, 0.1), (100, 4, 3, 0, 0.5), (300, 6, 0, 2, 0.6)]) as store:
        cfg = configured(store)
    assert cfg.get("max_num_seqs") == 4
    assert "while others waited for capacity (vllm:num_requests_waiting_by_reason{reason=\"capacity\"}" \
        in cfg.source("max_num_seqs")


def test_deferred_only_waiting_leaves_the_cap_to_the_default_said_inferred(tmp_path: Path) -> None:
    with store_by_reason(tmp_path, [(0, 5, 0, 3, 0.4)]) as store:
        cfg = configured(store)
    assert cfg.get("max_num_seqs") == 128  # vLLM 0.32's CPU default, not the 5 that ran beside deferred requests
    assert cfg.source("max_num_seqs").startswith("inferred (the command line is not in the metrics): default")


def test_a_server_without_waiting_by_reason_counts_every_waiting_request(tmp_path: Path) -> None:
    with store_with(tmp_path, [(0, 3, 2, 0.5)]) as store:
        cfg = configured(store)
    assert cfg.get("max_num_seqs") == 3
    assert "while others waited (vllm:num_requests_waiting) and" in cfg.source("max_num_seqs")


def test_a_restart_starts_the_behaviour_over(tmp_path: Path) -> None:
    """4 ran while others waited; the server restarted (its process start time jumps) with a lower cap and
    1 runs while others wait: the cap is 1, read from the server's start on, and the source says so."""
    with store_with(tmp_path, [(0, 4, 3, 0.5), (300, 1, 3, 0.3)]) as store:
        starts = []
        for k in range(0, 600, 5):
            b = Batch(instance="a:8000", ts_ms=T0 + k * 1000)
            b.add("process_start_time_seconds", {}, (T0 if k < 300 else T0 + 300_000) / 1000)
            starts.append(b)
        store.append_many(starts)
        cfg = configured(store)
    assert cfg.get("max_num_seqs") == 1
    assert "2026-11-29T10:05:00Z (the server's start) .." in cfg.source("max_num_seqs"), cfg.source("max_num_seqs")
