"""Live configuration: argv parsing, cache_config_info from a real capture, defaults vs vLLM's code, snapshots."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis import vllm_defaults
from vllm_sentinel.agent.store.ingest import ingest_text
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.diagnosis.vllm_defaults import GIB, Hardware

REFERENCE = Path("/work/shared/reference/vllm-0.32.0-cpu-one-request.prom.txt")
CAPTURE = REFERENCE if REFERENCE.exists() else \
    Path(__file__).parents[2] / "collectors" / "fixtures" / "vllm-0.32.0-cpu-one-request.prom.txt"
MODELS = Path(__file__).parents[1] / "fixtures" / "models"
T0 = 1_764_000_000_000
INSTANCE = "127.0.0.1:8000"


@pytest.fixture
def store():
    s = Store.open(":memory:")
    ingest_text(s, CAPTURE.read_text(), INSTANCE, T0)
    yield s
    s.close()


def test_parse_argv_both_spellings_switches_and_positional_model():
    argv = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model=/models/m",
            "--max_num_seqs", "8", "--max-model-len=512", "--no-enable-prefix-caching", "--enable-chunked-prefill",
            "-tp", "2", "--scheduling-policy", "priority"]
    assert liveconfig.parse_vllm_argv(argv) == {
        "--model": "/models/m", "--max-num-seqs": "8", "--max-model-len": "512", "--enable-prefix-caching": "false",
        "--enable-chunked-prefill": "true", "--tensor-parallel-size": "2", "--scheduling-policy": "priority"}
    # `vllm serve MODEL` with a switch before the model must not swallow it
    assert liveconfig.parse_vllm_argv(["vllm", "serve", "--enforce-eager", "meta-llama/Llama-3-8B", "--port", "9"]) == {
        "--enforce-eager": "true", "--model": "meta-llama/Llama-3-8B", "--port": "9"}


def test_cache_config_info_from_a_real_capture_is_read_typed(store):
    labels = liveconfig.latest_cache_info(store, INSTANCE, T0)
    assert labels["num_gpu_blocks"] == "2048"
    typed = liveconfig.parse_cache_info(labels)
    assert typed["block_size"] == 128 and typed["num_gpu_blocks"] == 2048
    assert typed["enable_prefix_caching"] is True and typed["gpu_memory_utilization"] == 0.92
    assert typed["kv_cache_memory_bytes"] == GIB and "sliding_window" not in typed  # 'None' left out
    assert liveconfig.latest_cache_info(store, INSTANCE, T0 - 1) is None  # nothing before the scrape
    assert liveconfig.latest_cache_info(store, "other:1", T0) is None


def test_build_live_config_from_store_argv_and_model_config(store):
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODELS / "llama-3-8b"),
            "--max-num-seqs", "64", "--max-num-batched-tokens=4096"]
    cfg = liveconfig.collect(store, INSTANCE, T0, argv=argv)
    # engine-resolved values win, with their source
    assert (cfg.get("block_size"), cfg.source("block_size")) == (128, "cache_config_info")
    assert cfg.get("num_gpu_blocks") == 2048 and cfg.get("kv_capacity_tokens") == 262_144
    # flags
    assert (cfg.get("max_num_seqs"), cfg.source("max_num_seqs")) == (64, "flag --max-num-seqs")
    assert cfg.get("max_num_batched_tokens") == 4096
    # max_model_len from the engine's own kv_cache_size_tokens / kv_cache_max_concurrency
    assert cfg.get("max_model_len") == 2048 and cfg.source("max_model_len").startswith("cache_config_info")
    # model config.json
    assert cfg.get("num_kv_heads") == 8 and cfg.source("num_kv_heads").startswith("model config.json")
    assert cfg.get("kv_bytes_per_token") == 131_072
    # defaults, for the CPU inferred from the cache info (VLLM_CPU_KVCACHE_SPACE, block 128 not user-set)
    assert cfg.get("platform") == "cpu"
    assert cfg.get("scheduling_policy") == "fcfs" and cfg.source("scheduling_policy").startswith("default")
    assert cfg.get("enable_chunked_prefill") is True


def test_cpu_api_server_default_max_num_seqs_when_no_flag(store):
    cfg = liveconfig.collect(store, INSTANCE, T0, argv=["vllm", "serve", "/nonexistent/model"])
    assert cfg.get("max_num_seqs") == 128 and "CPU default" in cfg.source("max_num_seqs")
    assert cfg.get("max_num_batched_tokens") == 2048
    # the model dir is not on this host: say so instead of guessing
    assert cfg.get("kv_bytes_per_token") is None
    assert "not reachable" in cfg.source("kv_bytes_per_token")
    assert cfg.missing("kv_bytes_per_token", "block_size") == [
        f"kv_bytes_per_token ({cfg.source('kv_bytes_per_token')[len('unknown: '):]})"]


def test_unknown_platform_leaves_hardware_dependent_defaults_unknown_with_the_reason():
    cfg = liveconfig.build_live_config("gpu:8000", None, None, None, "")
    assert cfg.get("max_num_seqs") is None
    assert "platform" in cfg.source("max_num_seqs") and cfg.source("max_num_seqs").startswith("unknown: ")
    assert "cache_config_info" in cfg.source("num_gpu_blocks")
    assert cfg.get("gpu_memory_utilization") == 0.92  # hardware-independent defaults are known
    h200 = liveconfig.build_live_config("gpu:8000", None, None, None, "", hardware=Hardware("gpu", 141 * GIB, "NVIDIA H200"))
    assert h200.get("max_num_seqs") == 1024 and h200.get("max_num_batched_tokens") == 8192
    a100 = liveconfig.build_live_config("gpu:8000", None, None, None, "", hardware=Hardware("gpu", 80 * GIB, "NVIDIA A100-SXM4-80GB"))
    assert a100.get("max_num_seqs") == 256 and a100.get("block_size") == 16


def test_gpu_blocks_give_kv_bytes_when_vllm_does_not_report_them():
    labels = {"block_size": "16", "num_gpu_blocks": "10000", "gpu_memory_utilization": "0.9",
              "kv_cache_memory_bytes": "None", "cache_dtype": "auto", "enable_prefix_caching": "True"}
    model = json.loads((MODELS / "llama-2-7b" / "config.json").read_text())
    cfg = liveconfig.build_live_config("g:1", labels, ["vllm", "serve", "x"], model, "fixture")
    assert cfg.get("kv_capacity_tokens") == 160_000
    assert cfg.get("kv_cache_memory_bytes") == 160_000 * 524_288
    assert cfg.source("kv_cache_memory_bytes").startswith("derived")
    assert cfg.get("max_model_len") == 4096  # from config.json max_position_embeddings


def test_find_model_config_dir_file_and_hf_cache(tmp_path, monkeypatch):
    cfg, where = liveconfig.find_model_config(str(MODELS / "mistral-7b-v0.1"))
    assert cfg["sliding_window"] == 4096 and where.endswith("config.json")
    cfg, _ = liveconfig.find_model_config(str(MODELS / "llama-3-8b" / "config.json"))
    assert cfg["num_key_value_heads"] == 8
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"num_hidden_layers": 2}')
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg, where = liveconfig.find_model_config("acme/tiny")
    assert cfg == {"num_hidden_layers": 2} and "abc123" in where
    cfg, why = liveconfig.find_model_config("acme/absent")
    assert cfg is None and "not reachable" in why


def test_snapshots_saved_only_on_change_and_loaded_as_of_a_time(store):
    a = liveconfig.build_live_config(INSTANCE, {"block_size": "16", "num_gpu_blocks": "100"}, ["vllm", "serve", "m", "--max-num-seqs", "256"], None, "absent")
    assert liveconfig.save_snapshot(store, a, T0) is True
    same = liveconfig.build_live_config(INSTANCE, {"block_size": "16", "num_gpu_blocks": "100"}, ["vllm", "serve", "m", "--max-num-seqs", "256"], None, "absent")
    assert liveconfig.save_snapshot(store, same, T0 + 1000) is False
    b = liveconfig.build_live_config(INSTANCE, {"block_size": "16", "num_gpu_blocks": "100"}, ["vllm", "serve", "m", "--max-num-seqs", "128"], None, "absent")
    assert liveconfig.save_snapshot(store, b, T0 + 60_000) is True
    assert liveconfig.load_snapshot_at(store, INSTANCE, T0 - 1) is None
    at = liveconfig.load_snapshot_at(store, INSTANCE, T0 + 59_999)
    assert at.get("max_num_seqs") == 256 and at.ts_ms == T0 and at.source("max_num_seqs") == "flag --max-num-seqs"
    assert liveconfig.load_snapshot_at(store, INSTANCE, T0 + 60_000).get("max_num_seqs") == 128
    hist = liveconfig.snapshot_history(store, INSTANCE, T0 + 10, T0 + 120_000)
    assert [h.get("max_num_seqs") for h in hist] == [256, 128]
    rows = store.cursor().execute("SELECT count(*) FROM config_snapshots").fetchone()[0]
    assert rows == 2


def test_snapshots_survive_reopening_the_file(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        liveconfig.save_snapshot(s, liveconfig.build_live_config("i", {"block_size": "16"}, None, None, ""), T0)
    with Store.open(path, read_only=True) as s:
        assert liveconfig.load_snapshot_at(s, "i", T0).get("block_size") == 16


# --- vllm_defaults against vLLM's own code on this (CPU) machine ----------------------------------

def test_cpu_batch_defaults_match_vllm():
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
    cpu = Hardware("cpu")
    assert vllm_defaults.max_num_seqs(cpu).value == seqs[UsageContext.OPENAI_API_SERVER] == 128
    assert vllm_defaults.max_num_seqs(cpu, vllm_defaults.LLM_CLASS).value == seqs[UsageContext.LLM_CLASS]
    assert vllm_defaults.max_num_batched_tokens(cpu, 4096).value == tokens[UsageContext.OPENAI_API_SERVER]
    tokens2, seqs2 = EngineArgs.get_batch_defaults(world_size=2)
    assert vllm_defaults.max_num_seqs(Hardware("cpu", world_size=2)).value == seqs2[UsageContext.OPENAI_API_SERVER]


def test_config_class_defaults_match_vllm():
    pytest.importorskip("vllm")
    from vllm.config import CacheConfig, SchedulerConfig

    cache = {f.name: f.default for f in dataclasses.fields(CacheConfig)}
    sched = {f.name: f.default for f in dataclasses.fields(SchedulerConfig)}

    def default(v):  # pydantic Field(default=...) objects carry .default
        return getattr(v, "default", v)

    assert default(cache["gpu_memory_utilization"]) == vllm_defaults.GPU_MEMORY_UTILIZATION.value
    assert default(cache["cache_dtype"]) == vllm_defaults.CACHE_DTYPE.value
    assert default(cache["enable_prefix_caching"]) == vllm_defaults.ENABLE_PREFIX_CACHING.value
    assert CacheConfig.DEFAULT_BLOCK_SIZE == vllm_defaults.BLOCK_SIZE_GPU.value
    assert default(sched["policy"]) == vllm_defaults.SCHEDULING_POLICY.value
    assert default(sched["long_prefill_token_threshold"]) == vllm_defaults.LONG_PREFILL_TOKEN_THRESHOLD.value


def test_chunked_prefill_off_raises_batched_tokens_to_max_model_len():
    d = vllm_defaults.max_num_batched_tokens(Hardware("cpu"), 8192, enable_chunked_prefill=False)
    assert d.value == 8192 and "chunked prefill is off" in d.note
    assert vllm_defaults.max_num_batched_tokens(Hardware(None), 8192).value is None


def test_record_snapshot_stores_what_collect_builds_once(store):
    argv = ["vllm", "serve", str(MODELS / "llama-3-8b"), "--max-num-seqs", "8"]
    cfg = liveconfig.record_snapshot(store, INSTANCE, T0, argv)
    again = liveconfig.record_snapshot(store, INSTANCE, T0 + 1000, argv)
    assert cfg.values == again.values
    assert store.cursor().execute("SELECT count(*) FROM config_snapshots").fetchone()[0] == 1
    assert liveconfig.load_snapshot_at(store, INSTANCE, T0 + 5000).get("kv_bytes_per_token") == 131_072
