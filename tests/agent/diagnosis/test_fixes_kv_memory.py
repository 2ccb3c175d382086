"""The memory levers of kv_cache_pressure: more KV blocks where the reserved memory, the host or the GPU allow."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.diagnosis.fix_registry import as_live_config
from vllm_sentinel.agent.diagnosis.fixes import compute
from vllm_sentinel.agent.diagnosis.fixes_kv_memory import blocks_needed

# the recorded CPU server: 8 blocks of 128 tokens by --num-gpu-blocks-override, while 1 GiB of KV space is reserved
CPU = load_metadata(default_recording())["config_snapshots"][0]["config"]
# its kv_cache_pressure episode: 4 running, 8 waiting, 204 + 200 tokens a request
EVIDENCE = {"running": 4, "waiting": 8, "mean_prompt_tokens": 204, "mean_generation_tokens": 200}
H100 = {"platform": "gpu", "max_num_seqs": 128, "num_gpu_blocks": 2000, "block_size": 16, "kv_bytes_per_token": 131072,
        "gpu_memory_utilization": 0.9, "cache_dtype": "auto", "model_dtype": "bfloat16"}


def test_the_override_is_raised_to_the_blocks_the_running_requests_need():
    fix = compute("kv_cache_pressure.num_gpu_blocks_override", as_live_config(CPU), EVIDENCE)
    # 4 requests (max-num-seqs) x 4 whole blocks (404 tokens) / 0.9 = 17.8 -> 18, + 1 null block
    assert (fix.param, fix.current, fix.suggested) == ("--num-gpu-blocks-override", "8", "19")
    assert "1 GiB of KV memory is reserved (4,096 blocks" in fix.why and "capped by --max-num-seqs 4" in fix.why
    # more waiting than --max-num-seqs admits is capped by it; a roomier cap takes them all
    wide = as_live_config({**CPU, "max_num_seqs": 128})
    assert compute("kv_cache_pressure.num_gpu_blocks_override", wide, EVIDENCE).suggested == "55"  # 12 x 4 / 0.9
    # no override (vLLM sized the cache), or enough blocks already: not this lever
    assert compute("kv_cache_pressure.num_gpu_blocks_override",
                   as_live_config({**CPU, "num_gpu_blocks_override": None}), EVIDENCE) is None
    assert compute("kv_cache_pressure.num_gpu_blocks_override",
                   as_live_config({**CPU, "num_gpu_blocks_override": 64, "num_gpu_blocks": 64}), EVIDENCE) is None


def test_on_cpu_without_an_override_the_kv_space_grows():
    small = as_live_config({**CPU, "num_gpu_blocks_override": None, "max_num_seqs": 128, "num_gpu_blocks": 8,
                            "kv_cache_memory_bytes": 8 * 128 * 2048})
    fix = compute("kv_cache_pressure.cpu_kv_space", small, EVIDENCE)
    assert (fix.param, fix.suggested) == ("VLLM_CPU_KVCACHE_SPACE", "1")  # 55 blocks x 256 KiB = 13.75 MiB -> 1 GiB
    assert compute("kv_cache_pressure.cpu_kv_space", as_live_config({**H100}), EVIDENCE) is None


def test_on_gpu_utilisation_rises_within_the_measured_headroom_and_fp8_doubles_the_cache():
    busy = {**EVIDENCE, "running": 128, "waiting": 40, "mean_prompt_tokens": 300, "mean_generation_tokens": 200}
    need, _how = blocks_needed(as_live_config(H100), busy)
    assert need == 4553  # 128 x 32 whole blocks (500 tokens) / 0.9 = 4551.1 -> 4552, + 1 null block
    fix = compute("kv_cache_pressure.gpu_memory_utilization", as_live_config(H100),
                  {**busy, "gpu_memory_total_bytes": 80 * 1024**3, "gpu_memory_used_ratio": 0.90})
    # 2,553 more blocks x 2 MiB = 6.2 % of 80 GiB; the headroom to 95 % is 5 %: 0.9 + 0.05 = 0.95
    assert (fix.param, fix.current, fix.suggested) == ("--gpu-memory-utilization", "0.9", "0.95")
    assert "headroom allows only part of it" in fix.why
    assert compute("kv_cache_pressure.gpu_memory_utilization", as_live_config(H100),
                   {**busy, "gpu_memory_total_bytes": 80 * 1024**3, "gpu_memory_used_ratio": 0.96}) is None
    assert compute("kv_cache_pressure.gpu_memory_utilization", as_live_config(H100), busy) is None  # no NVML
    fp8 = compute("kv_cache_pressure.kv_cache_dtype", as_live_config({**H100, "num_gpu_blocks": 3000}), busy)
    assert (fp8.current, fp8.suggested) == ("auto", "fp8") and "6,000 blocks" in fp8.why
    assert compute("kv_cache_pressure.kv_cache_dtype", as_live_config(CPU), EVIDENCE) is None


@pytest.mark.parametrize("name", ["kv_cache_pressure.num_gpu_blocks_override", "kv_cache_pressure.cpu_kv_space",
                                  "kv_cache_pressure.gpu_memory_utilization", "kv_cache_pressure.kv_cache_dtype"])
def test_without_lengths_or_configuration_no_memory_lever_is_guessed(name):
    assert compute(name, as_live_config({}), {}) is None
