"""Fix computations: concrete values with their arithmetic, or the missing source named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_sentinel.agent.diagnosis import fixes
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.fixes import FIXES, compute
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.diagnosis.vllm_defaults import GIB, Hardware

MODELS = Path(__file__).parents[1] / "fixtures" / "models"
LLAMA3 = json.loads((MODELS / "llama-3-8b" / "config.json").read_text())
T0 = 1_764_000_000_000


def gpu_config(*flags: str, blocks: int = 17_900, **labels: str) -> liveconfig.LiveConfig:
    """Llama-3-8B on an 80 GiB H100, block 16, with the given flags."""
    info = {"block_size": "16", "num_gpu_blocks": str(blocks), "gpu_memory_utilization": "0.9",
            "enable_prefix_caching": "True", "cache_dtype": "auto", "kv_cache_memory_bytes": "None", **labels}
    return liveconfig.build_live_config("gpu:8000", info, ["vllm", "serve", "meta-llama/Meta-Llama-3-8B", *flags],
                               LLAMA3, "fixture", Hardware("gpu", 80 * GIB, "NVIDIA H100 80GB HBM3"))


def test_kv_cache_pressure_256_to_128_with_the_arithmetic():
    cfg = gpu_config("--max-num-seqs", "256")
    f = compute("kv_cache_pressure", cfg, {"mean_prompt_tokens": 1000, "mean_generation_tokens": 1000})
    assert (f.param, f.current, f.suggested) == ("--max-num-seqs", "256", "128")
    # (17,900 - 1 null block) x 16 = 286,384 tokens; x 0.9 / (2000 + 8) = 128
    assert "286,384 tokens" in f.why and "17,899 usable blocks" in f.why and "= 128 sequences" in f.why
    assert "512,000 tokens, 179% of capacity" in f.why


def test_kv_cache_pressure_without_lengths_uses_max_model_len():
    cfg = gpu_config("--max-num-seqs", "256", "--max-model-len", "4096")
    f = compute("kv_cache_pressure", cfg, {})
    # 286,384 x 0.9 / (4096 + 8) = 62
    assert f.suggested == "62" and "max_model_len 4,096 (request lengths unknown)" in f.why


def test_kv_cache_pressure_when_the_mean_fits_falls_back_to_the_full_length_bound():
    cfg = gpu_config("--max-num-seqs", "64", "--max-model-len", "8192")
    f = compute("kv_cache_pressure", cfg, {"mean_prompt_tokens": 500, "mean_generation_tokens": 100})
    # 17,900 blocks / (8192 / 16 = 512 blocks per request) = 34.96 -> 34
    assert f.suggested == "34" and "never preempt" in f.why


def test_kv_cache_pressure_names_the_missing_source():
    cfg = liveconfig.build_live_config("x:1", None, ["vllm", "serve", "m", "--max-num-seqs", "256"], None,
                              "config.json of 'm' not reachable from this host")
    f = compute("kv_cache_pressure", cfg, {"mean_prompt_tokens": 100, "mean_generation_tokens": 100})
    assert f.suggested is None and not f.concrete
    assert f.current == "256"
    assert "num_gpu_blocks (no vllm:cache_config_info sample" in f.why


def test_queue_blocking_raises_max_num_seqs_when_kv_has_room_else_replicas():
    cfg = gpu_config("--max-num-seqs", "32")
    ev = {"mean_prompt_tokens": 1000, "mean_generation_tokens": 1000, "waiting": 50, "running": 32}
    f = compute("queue_blocking", cfg, ev)
    assert (f.current, f.suggested) == ("32", "64")  # 128 fit; at most double per change
    assert compute("queue_blocking.replicas", cfg, ev) is None  # raise max-num-seqs first
    full = gpu_config("--max-num-seqs", "128")
    assert compute("queue_blocking", full, ev) is None  # 128 already fill the KV cache
    r = compute("queue_blocking.replicas", full, {**ev, "running": 128, "waiting": 200})
    assert (r.param, r.current, r.suggested) == ("replicas", "1", "3")  # (128 + 200) / 128 -> 3
    assert "(128 + 200" not in r.why and "running 128 + waiting 200" in r.why


def test_prefill_hol_blocking_fixes():
    cfg = gpu_config("--max-num-seqs", "256")  # H100 API-server default budget 8192
    assert cfg.get("max_num_batched_tokens") == 8192 and cfg.source("max_num_batched_tokens").startswith("default")
    f = compute("prefill_hol_blocking", cfg, {"iteration_tokens_p95": 8192})
    assert (f.param, f.current, f.suggested) == ("--max-num-batched-tokens", "8192", "4096")
    t = compute("prefill_hol_blocking.long_prefill_token_threshold", cfg, {})
    assert (t.current, t.suggested) == ("0", "2048")
    assert compute("prefill_hol_blocking.chunked_prefill", cfg, {}) is None  # already on by default
    off = gpu_config("--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")
    c = compute("prefill_hol_blocking.chunked_prefill", off, {})
    assert (c.current, c.suggested) == ("false", "true") and "flag --enable-chunked-prefill" in c.why
    assert compute("prefill_hol_blocking", off, {}) is None  # chunking first
    low = gpu_config("--max-num-batched-tokens", "512")
    assert compute("prefill_hol_blocking", low, {}) is None  # already at the floor


def test_prefill_length_routing_from_the_prompt_quantiles():
    cfg = gpu_config("--max-num-seqs", "256")  # budget 8192
    bimodal = {"prompt_tokens_p25": 30.7, "prompt_tokens_p50": 41.4, "prompt_tokens_p75": 1166.7,
               "prompt_tokens_p90": 1666.7, "prompt_tokens_p95": 1833.3, "prompt_tokens_p99": 1966.7,
               "prompt_spread_ratio": 4}
    f = compute("prefill_hol_blocking.length_routing", cfg, bimodal)
    # the sparsest stretch is p50..p75 (41..1167 tokens, a quarter of the prompts): its log-middle 220 -> 200
    assert f.suggested.startswith("prompts <= 200 tokens -> short pool (--max-num-batched-tokens 512 ")
    assert "long pool (--max-num-batched-tokens 8192 --long-prefill-token-threshold 2048)" in f.suggested
    one_mode = {**bimodal, "prompt_tokens_p75": 45, "prompt_tokens_p90": 48, "prompt_tokens_p95": 49,
                "prompt_tokens_p99": 50}
    assert compute("prefill_hol_blocking.length_routing", cfg, one_mode) is None
    missing = compute("prefill_hol_blocking.length_routing", cfg, {"prompt_spread_ratio": 4})
    assert missing.suggested is None and "prompt_tokens_p50" in missing.why


def test_oom_risk_fixes():
    cfg = gpu_config("--max-num-seqs", "256", "--max-model-len", "8192", "--gpu-memory-utilization", "0.95")
    assert cfg.get("gpu_memory_utilization") == 0.9  # the engine's cache_config_info wins over the flag
    f = compute("oom_risk", cfg, {"gpu_memory_used_ratio": 0.99, "gpu_memory_total_bytes": 80 * GIB})
    assert (f.current, f.suggested) == ("0.9", "0.86")
    assert "costs about" in f.why
    assert compute("oom_risk", cfg, {"gpu_memory_used_ratio": 0.9}) is None
    m = compute("oom_risk.max_model_len", cfg, {})
    # 286,384 // 256 = 1118 -> 1104 (a multiple of 16)
    assert (m.current, m.suggested) == ("8192", "1104")
    assert compute("oom_risk.max_model_len", cfg, {"mean_prompt_tokens": 1500, "mean_generation_tokens": 200}) is None
    g = compute("oom_risk", cfg, {})
    assert g.suggested is None and "gpu_memory_used_ratio" in g.why


def test_kv_fragmentation_block_size():
    cfg = gpu_config("--block-size", "128", blocks=2000, block_size="128")
    ev = {"running": 100, "kv_usage": 0.1, "mean_prompt_tokens": 40, "mean_generation_tokens": 40}
    f = compute("kv_fragmentation", cfg, ev)
    assert (f.current, f.suggested) == ("128", "16")
    assert "100 running requests hold about 6,000 tokens" in f.why and "200 blocks x 128 = 25,587 slots" in f.why
    assert compute("kv_fragmentation", gpu_config(), ev) is None  # block 16 is already the smallest
    miss = compute("kv_fragmentation", cfg, {"running": 3})
    assert miss.suggested is None and "evidence kv_usage" in miss.why


def test_underbatched_and_slo_fixes():
    cfg = gpu_config("--max-num-seqs", "256", "--max-num-batched-tokens", "2048")
    u = compute("underbatched", cfg, {"iteration_tokens_p95": 2048})
    assert (u.current, u.suggested) == ("2048", "4096")
    assert compute("underbatched", cfg, {"iteration_tokens_p95": 300}) is None
    r = compute("underbatched.replicas", cfg, {"replicas": 4, "running": 20})
    assert (r.current, r.suggested) == ("4", "1")  # 4 x 20 / 179.2 -> 1
    t = compute("tpot_slo_breach", cfg, {"tpot_p95_seconds": 0.08, "tpot_slo_seconds": 0.05, "running": 40})
    assert (t.current, t.suggested) == ("256", "25")
    q = compute("ttft_slo_breach", gpu_config("--max-num-seqs", "32"),
                {"ttft_p95_seconds": 4.0, "queue_time_p95_seconds": 3.5, "mean_prompt_tokens": 1000,
                 "mean_generation_tokens": 1000})
    assert q.suggested == "64" and q.why.startswith("queueing is 88% of TTFT")
    b = compute("ttft_slo_breach.max_num_batched_tokens", cfg, {"mean_prompt_tokens": 5000})
    assert (b.current, b.suggested) == ("2048", "5120")


def test_every_fix_is_concrete_or_says_what_is_missing_on_an_empty_config():
    empty = liveconfig.build_live_config("x:1", None, None, None, "model config.json not given")
    for name, fn in FIXES.items():
        f = fn(empty, {})
        if f is not None:
            assert f.concrete or ("missing" in f.why and f.missing), name


def test_incidents_hook_fills_a_rule_fix_from_a_stored_snapshot():
    from vllm_sentinel.agent.diagnosis import incidents
    from vllm_sentinel.agent.alerts.rulemodel import Rule, RuleFix

    assert "kv_cache_pressure" in FIXES
    with Store.open(":memory:") as store:
        liveconfig.save_snapshot(store, gpu_config("--max-num-seqs", "256"), T0)
        config_for = liveconfig.config_for(store, T0 + 5000)
        rule = Rule(name="VllmKvCachePressure", kind="alert", expr="vector(1)",
                    fix=[RuleFix(param="--max-num-seqs", compute="kv_cache_pressure")])
        items = incidents.compute_fixes(rule, config_for("gpu:8000"),
                                        {"mean_prompt_tokens": 1000.0, "mean_generation_tokens": 1000.0},
                                        {"instance": "gpu:8000"})
    assert items[0]["param"] == "--max-num-seqs"
    assert (items[0]["current"], items[0]["suggested"]) == ("256", "128")
    assert "286,384 tokens" in items[0]["why"]


def test_plain_mapping_config_works():
    f = compute("kv_cache_pressure", {"max_num_seqs": 256, "num_gpu_blocks": 17_900, "block_size": 16},
                {"mean_prompt_tokens": 1000, "mean_generation_tokens": 1000})
    assert f.suggested == "128"
    with pytest.raises(KeyError):
        compute("no_such_fix", {}, {})


def test_engine_stall_shortens_the_step_timeout_from_vllms_default():
    from vllm_sentinel.agent.diagnosis.fixes import compute
    f = compute("engine_stall", {}, {"itl_p99_seconds": 0.02})
    assert (f.param, f.current, f.suggested) == ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300", "60")
    slow = compute("engine_stall", {}, {"itl_p99_seconds": 12.0})  # a slow model: 10 x its worst gap
    assert slow.suggested == "120"
    assert compute("engine_stall", {"execute_model_timeout_s": 60}, {}) is None  # already short: not the lever


def test_load_imbalance_names_the_router_policy_with_the_numbers():
    cfg = gpu_config("--max-num-seqs", "4")
    f = compute("load_imbalance.router", cfg, {"waiting": 6, "running": 4, "idle_replicas": 2, "idle_running": 0.5,
                                                "replicas": 3, "request_rate": 6.0, "fleet_request_rate": 8.0,
                                                "queue_time_p95_seconds": 2.5})
    assert f.param == "router policy" and f.suggested.startswith("least-loaded")
    assert f.current == "75% of the model's requests to this replica (an even share is 33%)"
    # 2 idle replicas x (4 - 0.5) free slots = 7 >= 6 waiting: the whole queue fits elsewhere
    assert "6 requests wait here (2.5 s queue-time p95) while 2 of 3 replicas run 0.5" in f.why
    assert "7 free sequence slots there (2 x (--max-num-seqs 4 - 0.5)) would take the whole queue" in f.why
    assert "--routing-logic" in f.why and "llm-d" in f.why


def test_load_imbalance_without_the_flag_uses_the_busiest_replicas_running_peak():
    f = compute("load_imbalance.router", {}, {"waiting": 20, "running": 8, "idle_replicas": 1, "idle_running": 2})
    assert "6 free sequence slots there (1 x (the 8 it runs at its cap - 2)) would take the whole queue in part" in f.why


def test_load_imbalance_without_evidence_names_it():
    f = compute("load_imbalance.router", {}, {"waiting": 20})
    assert f.suggested is None and "evidence running" in f.why and "evidence idle_replicas" in f.why


def cpu_config(*flags: str, blocks: int = 8) -> liveconfig.LiveConfig:
    """The tiny model on vLLM's CPU backend as the scenarios run it: 128-token blocks, an 8-block cache."""
    info = {"block_size": "128", "num_gpu_blocks": str(blocks), "kv_cache_memory_bytes": "1073741824",
            "user_specified_block_size": "False", "enable_prefix_caching": "True", "cache_dtype": "auto"}
    return liveconfig.build_live_config("cpu:8000", info, ["python", "-m", "vllm.entrypoints.openai.api_server",
                                                           "--model", "/m", *flags], None, "not needed")


# 48 clients of 16+16 tokens on the 8-block CPU cache: every block held, 7 run (one block is vLLM's null block)
FRAGMENTED = {"running": 7, "kv_usage": 1.0, "mean_prompt_tokens": 16, "mean_generation_tokens": 16, "waiting": 41}


def test_kv_fragmentation_block_size_respects_the_platforms_smallest_block():
    cfg = cpu_config("--max-num-seqs", "64")
    assert cfg.get("platform") == "cpu"
    f = compute("kv_fragmentation", cfg, FRAGMENTED)
    assert (f.current, f.suggested) == ("128", "32")  # the CPU kernel takes multiples of 32, not GPU's 16
    # 7 x (16 + 8) = 168 tokens in 1.0 x 7 blocks (8 less vLLM's null block) x 128 = 896 slots: 19 % used
    assert "7 running requests hold about 168 tokens" in f.why and "7 blocks x 128 = 896 slots, 19% used" in f.why
    assert "hold 7 such requests at once in 128-token blocks, 31 in 32-token blocks" in f.why
    assert "scale it by 4" in f.why
    unknown = liveconfig.build_live_config("x:1", {"block_size": "128", "num_gpu_blocks": "8"}, None, None, "n/a")
    assert unknown.get("platform") is None
    assert compute("kv_fragmentation", unknown, FRAGMENTED).suggested == "32"  # accepted by every backend


def test_when_blocks_cap_concurrency_max_num_seqs_is_not_raised_and_the_fix_says_why():
    cfg = cpu_config("--max-num-seqs", "64")
    q = compute("queue_blocking", cfg, FRAGMENTED)
    assert (q.param, q.current, q.suggested) == ("--max-num-seqs", "64", None)
    assert q.why.startswith("not raised: the KV cache is 100% used by 7 running requests of ~24 tokens in "
                            "128-token blocks (19% of each held block used)")
    assert "8 blocks, not --max-num-seqs, cap how many run" in q.why and "--block-size" in q.why
    m = compute("kv_fragmentation.max_num_seqs", cfg, FRAGMENTED)
    assert (m.current, m.suggested) == ("64", None) and m.why.startswith("leave it: ")
    # long requests in a full cache: capacity, not granularity; the queue fix stays silent as before
    long = {**FRAGMENTED, "mean_prompt_tokens": 200, "mean_generation_tokens": 200}
    assert compute("queue_blocking", cfg, long) is None
    assert compute("kv_fragmentation.max_num_seqs", cfg, long) is None
    assert compute("kv_fragmentation.max_num_seqs", cfg, {**FRAGMENTED, "kv_usage": 0.5}) is None
