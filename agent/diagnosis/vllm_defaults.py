"""vLLM 0.32's defaults for the engine flags our fixes talk about, and what they depend on.

Read from the installed vllm 0.32.0 source (site-packages/vllm, paths below are relative to it).
A default is used only where neither the command line nor `vllm:cache_config_info` says what the
server runs with; several depend on the hardware and on how vLLM was started, so they take that
context and say when it is unknown rather than guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VLLM_VERSION = "0.32"
GIB = 1 << 30

PLATFORM_CPU = "cpu"
PLATFORM_GPU = "gpu"

# usage contexts (vllm/usage/usage_lib.py UsageContext): `vllm serve` and
# `python -m vllm.entrypoints.openai.api_server` are OPENAI_API_SERVER; `LLM(...)` in a script is LLM_CLASS
API_SERVER = "api_server"
LLM_CLASS = "llm_class"


@dataclass(frozen=True)
class Hardware:
    """What a default may depend on: platform, device memory and name, TP x PP world size."""

    platform: str | None = None  # "cpu" | "gpu" | None (unknown)
    device_memory_bytes: int | None = None  # per GPU
    device_name: str = ""
    world_size: int = 1  # tensor_parallel_size x pipeline_parallel_size


@dataclass(frozen=True)
class Default:
    """A default value and the reason it is that value (or None with the reason it is unknown)."""

    value: Any
    note: str


def max_num_seqs(hw: Hardware, usage: str = API_SERVER) -> Default:
    """Default --max-num-seqs. CPU API server -> 128 x world; GPU <70 GiB -> 256; H100/H200/B200 -> 1024.

    engine/arg_utils.py:2894-2987 get_batch_defaults: >=160 GiB devices 1024 (:2923), >=70 GiB and not
    A100 1024 (:2933), other GPUs 256; CPU (:2975) 256 x world_size for LLM, 128 x world_size for the
    API server. --performance-mode throughput doubles it (:3130); not modelled here.
    """
    if hw.platform == PLATFORM_CPU:
        per = 128 if usage == API_SERVER else 256
        return Default(per * hw.world_size, f"vLLM {VLLM_VERSION} CPU default ({per} x world size {hw.world_size})")
    if hw.platform == PLATFORM_GPU:
        if hw.device_memory_bytes is None:
            return Default(None, "GPU default depends on device memory (256 below 70 GiB or on A100, 1024 on "
                                 "H100/H200/B200), and the device memory is unknown")
        if hw.device_memory_bytes >= 160 * GIB or (hw.device_memory_bytes >= 70 * GIB and "a100" not in hw.device_name.lower()):
            return Default(1024, f"vLLM {VLLM_VERSION} default for GPUs of >= 70 GiB other than A100")
        return Default(256, f"vLLM {VLLM_VERSION} default for GPUs below 70 GiB or A100")
    return Default(None, "default depends on the platform (128 on a CPU API server, 256 or 1024 on GPUs), "
                         "which is unknown: pass --max-num-seqs explicitly or let the sidecar see the GPU")


def max_num_batched_tokens(hw: Hardware, max_model_len: int | None, enable_chunked_prefill: bool = True,
                           usage: str = API_SERVER) -> Default:
    """Default --max-num-batched-tokens: CPU API server 2048 x world; GPU API server 2048 / 8192 / 16384.

    engine/arg_utils.py get_batch_defaults (:2894): API server 16384 on >= 160 GiB, 8192 on >= 70 GiB
    non-A100, else 2048; CPU 2048 x world_size (API server) or 4096 x world_size (LLM class).
    Without chunked prefill it is raised to at least max_model_len (:3140-3145).
    """
    if hw.platform == PLATFORM_CPU:
        base = (2048 if usage == API_SERVER else 4096) * hw.world_size
        note = f"vLLM {VLLM_VERSION} CPU default"
    elif hw.platform == PLATFORM_GPU and hw.device_memory_bytes is not None:
        big = hw.device_memory_bytes >= 160 * GIB
        large = hw.device_memory_bytes >= 70 * GIB and "a100" not in hw.device_name.lower()
        if usage == API_SERVER:
            base = 16384 if big else 8192 if large else 2048
        else:
            base = 16384 if (big or large) else 8192
        note = f"vLLM {VLLM_VERSION} GPU default for {hw.device_memory_bytes / GIB:.0f} GiB devices"
    else:
        return Default(None, "default depends on the platform and GPU memory (2048 on CPU and small GPUs, "
                             "8192 on H100/H200, 16384 on >= 160 GiB), which are unknown")
    if not enable_chunked_prefill and max_model_len is not None and max_model_len > base:
        return Default(max_model_len, note + ", raised to max_model_len because chunked prefill is off")
    return Default(base, note)


# flags whose default does not depend on the hardware
BLOCK_SIZE_GPU = Default(16, "config/cache.py:72 CacheConfig.DEFAULT_BLOCK_SIZE (an attention backend may "
                             "prefer another, platforms/interface.py:773)")
BLOCK_SIZE_CPU = Default(128, "platforms/cpu.py:293: the CPU backend uses 128 unless --block-size is given")
GPU_MEMORY_UTILIZATION = Default(0.92, "config/cache.py:102")
CACHE_DTYPE = Default("auto", "config/cache.py:122: the model's dtype")
ENABLE_PREFIX_CACHING = Default(True, "config/cache.py:141, engine/arg_utils.py:2990-3013: on for "
                                      "generative models (off for some pooling models and RISC-V CPUs)")
ENABLE_CHUNKED_PREFILL = Default(True, "engine/arg_utils.py:2990 model_config.is_chunked_prefill_supported: "
                                       "on for generative decoder models (config/model.py:2175)")
SCHEDULING_POLICY = Default("fcfs", "config/scheduler.py:159")
LONG_PREFILL_TOKEN_THRESHOLD = Default(0, "config/scheduler.py:79 (0: no limit on one request's prefill chunk)")


def block_size(hw: Hardware) -> Default:
    """Default --block-size: 128 on CPU, 16 on GPU (unknown platform: unknown)."""
    if hw.platform == PLATFORM_CPU:
        return BLOCK_SIZE_CPU
    if hw.platform == PLATFORM_GPU:
        return BLOCK_SIZE_GPU
    return Default(None, "default depends on the platform (16 on GPU, 128 on CPU), which is unknown")


def max_model_len(derived_from_config: int | None, key: str | None = None) -> Default:
    """Default --max-model-len: the smallest length key of the model's config.json.

    transformers_utils/model_arch_config_convertor.py:394-420 derive_max_model_len_and_key
    (max_position_embeddings, n_positions, max_seq_len, ...), then config/model.py:2527
    _get_and_verify_max_len (capped by the tokenizer's model_max_length and a sliding window on
    models without sliding-window support; rope scaling multiplies it).
    """
    if derived_from_config is None:
        return Default(None, "derived from the model's config.json, which is not reachable")
    return Default(derived_from_config, f"vLLM derives it from config.json {key or 'max_position_embeddings'}")


def defaults_for(hw: Hardware, max_model_len_from_config: int | None = None,
                 enable_chunked_prefill: bool = True, usage: str = API_SERVER) -> dict[str, Default]:
    """Every default the fixes use, keyed by LiveConfig names."""
    return {
        "max_num_seqs": max_num_seqs(hw, usage),
        "max_num_batched_tokens": max_num_batched_tokens(hw, max_model_len_from_config, enable_chunked_prefill, usage),
        "max_model_len": max_model_len(max_model_len_from_config),
        "block_size": block_size(hw),
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "cache_dtype": CACHE_DTYPE,
        "enable_prefix_caching": ENABLE_PREFIX_CACHING,
        "enable_chunked_prefill": ENABLE_CHUNKED_PREFILL,
        "scheduling_policy": SCHEDULING_POLICY,
        "long_prefill_token_threshold": LONG_PREFILL_TOKEN_THRESHOLD,
    }
