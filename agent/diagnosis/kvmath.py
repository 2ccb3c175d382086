"""KV-cache arithmetic: bytes per token from a model's config.json, capacity, concurrency, fragmentation.

Pure functions, shared by the fix computations (agent/diagnosis/fixes.py) and `vllm-sentinel plan`. The
arithmetic mirrors vLLM 0.32's own (vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes,
vllm/v1/core/kv_cache_utils.py get_kv_cache_config_from_groups and
get_max_concurrency_for_kv_cache_config), so a capacity computed here equals the
`kv_cache_size_tokens` a server reports for the same KV memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
MIB = 1 << 20

# bytes per element of the KV cache; vLLM's --kv-cache-dtype names plus torch/HF dtype spellings
DTYPE_BYTES: dict[str, float] = {
    "float32": 4, "float": 4, "fp32": 4,
    "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1, "int8": 1,
    "int8_per_token_head": 1, "fp8_per_token_head": 1,
}

# keys a config.json may use for the same quantity, first match wins (HF naming varies by family)
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "n_kv_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
# vLLM takes the smallest of these as the derived max_model_len
# (vllm/transformers_utils/model_arch_config_convertor.py:394-420, derive_max_model_len_and_key)
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


class ModelConfigError(ValueError):
    """A config.json lacks what the KV arithmetic needs; the message names the keys."""


@dataclass(frozen=True)
class KvShape:
    """The parts of a model's architecture that size its KV cache."""

    num_layers: int
    num_kv_heads: int  # 1 for MLA (one latent per token and layer)
    head_dim: int  # for MLA: kv_lora_rank + qk_rope_head_dim
    model_dtype: str  # what vLLM's dtype=auto resolves to for this config
    is_mla: bool = False
    sliding_window: int | None = None  # only when every layer uses it
    max_position_embeddings: int | None = None
    model_type: str = ""

    @property
    def kv_factor(self) -> int:
        """2 (a key and a value vector) for attention, 1 for MLA's single latent."""
        return 1 if self.is_mla else 2


def _first(cfg: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return None


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config: multimodal configs nest it under `text_config`/`llm_config`."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and _first(sub, _LAYER_KEYS) is not None:
            merged = {k: v for k, v in cfg.items() if k not in ("text_config", "llm_config", "language_config")}
            merged.update(sub)
            return merged
    return cfg


def auto_dtype(cfg: dict[str, Any]) -> str:
    """The dtype vLLM's `--dtype auto` picks: the config's, but float32 is served as bfloat16.

    {'torch_dtype': 'float16'} -> 'float16'; {'dtype': 'float32'} -> 'bfloat16'; {} -> 'bfloat16'
    (vllm/config/model.py _resolve_auto_dtype: "Downcast for float32 models" to the platform's
    first supported dtype, bfloat16 on CUDA and x86 CPUs.)
    """
    raw = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    raw = str(raw).replace("torch.", "")
    if raw in ("float32", "float"):
        return "bfloat16"
    return raw


def kv_shape_from_config(cfg: dict[str, Any]) -> KvShape:
    """Read a config.json dict into a KvShape; ModelConfigError names missing keys.

    Llama-3-8B {'num_hidden_layers': 32, 'num_attention_heads': 32, 'num_key_value_heads': 8,
    'hidden_size': 4096, 'torch_dtype': 'bfloat16'} -> KvShape(32, 8, 128, 'bfloat16', ...)
    """
    cfg = text_config(cfg)
    _check_counts(cfg)
    layers = _first(cfg, _LAYER_KEYS)
    if layers is None:
        raise ModelConfigError(f"config.json has no layer count (one of {', '.join(_LAYER_KEYS)})")
    dtype = auto_dtype(cfg)
    max_len = min((int(cfg[k]) for k in _MAX_LEN_KEYS if isinstance(cfg.get(k), (int, float))), default=None)
    model_type = str(cfg.get("model_type", ""))
    kv_lora_rank = cfg.get("kv_lora_rank")
    if kv_lora_rank:
        # MLA (DeepSeek-V2/V3): one compressed latent plus the shared rope key per token and layer
        # (vllm/transformers_utils/model_arch_config_convertor.py:89-100, get_head_size)
        rope = cfg.get("qk_rope_head_dim")
        if rope is None:
            raise ModelConfigError("config.json has kv_lora_rank (MLA) but no qk_rope_head_dim")
        return KvShape(int(layers), 1, int(kv_lora_rank) + int(rope), dtype, True, None, max_len, model_type)
    heads = _first(cfg, _HEAD_KEYS)
    kv_heads = _first(cfg, _KV_HEAD_KEYS)
    if kv_heads is None:
        if cfg.get("multi_query") is True:  # Falcon-style MQA flag
            kv_heads = 1
        else:
            kv_heads = heads  # no GQA key: every head has its own K and V (MHA)
    head_dim = cfg.get("head_dim")
    if not head_dim:  # some configs write head_dim: null or 0 and mean "hidden / heads"
        hidden = _first(cfg, _HIDDEN_KEYS)
        missing = [name for name, v in (("num_attention_heads", heads), ("hidden_size", hidden)) if v is None]
        if missing:
            raise ModelConfigError(f"config.json has no head_dim and no {' or '.join(missing)} to derive it")
        head_dim = int(hidden) // int(heads)
    if kv_heads is None:
        raise ModelConfigError("config.json has neither num_key_value_heads nor num_attention_heads")
    return KvShape(int(layers), int(kv_heads), int(head_dim), dtype, False, _sliding_window(cfg), max_len,
                   model_type)


_MAX_COUNT = 2**24  # far above any real layer, head or width count; beyond it the file is wrong


def _check_counts(cfg: dict[str, Any]) -> None:
    """Refuse a count that is not a positive whole number (0 heads, -2 layers, "two"), naming the key."""
    for key in (*_LAYER_KEYS, *_HEAD_KEYS, *_KV_HEAD_KEYS, *_HIDDEN_KEYS, "head_dim", "kv_lora_rank",
                "qk_rope_head_dim"):
        v = cfg.get(key)
        if v is None or (key == "head_dim" and v == 0):  # head_dim 0 or null means "hidden / heads"
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= _MAX_COUNT or v != int(v):
            raise ModelConfigError(f"{key} is {v!r} in config.json: it must be a whole number from 1 to "
                                   f"{_MAX_COUNT:,}; fix the file (or pass the model's original config.json)")


def _sliding_window(cfg: dict[str, Any]) -> int | None:
    """The window when every layer slides; None when some layers attend fully (they set the cost)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:  # Qwen2 writes a window it does not use
        return None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and any("sliding" not in str(t) for t in layer_types):
        return None  # interleaved (Gemma-2/3, gpt-oss): full-attention layers dominate; stay conservative
    if cfg.get("max_window_layers") is not None:
        return None  # Qwen-style split of sliding and full layers: the full layers set the cost
    return int(window)


def dtype_bytes(cache_dtype: str, model_dtype: str) -> float:
    """Bytes per KV element: 'auto' follows the model dtype. ('auto', 'bfloat16') -> 2, ('fp8', _) -> 1."""
    name = model_dtype if cache_dtype in ("auto", "", None) else cache_dtype
    name = str(name).replace("torch.", "")
    if name not in DTYPE_BYTES:
        raise ModelConfigError(f"unknown KV cache dtype {name!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[name]


def kv_bytes_per_token(shape: KvShape, cache_dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    """KV bytes one token occupies on one GPU: kv_factor x layers x KV heads x head dim x bytes per element.

    LLaMA-7B FP16 (32 layers, 32 KV heads, head dim 128): 2*32*32*128*2 = 524288 (0.5 MiB);
    Llama-3-8B BF16 (8 KV heads) -> 131072; with cache_dtype='fp8' -> 65536.
    Tensor parallelism splits KV heads across GPUs (at least one head each, as vLLM replicates).
    """
    heads = shape.num_kv_heads if shape.is_mla else max(1, shape.num_kv_heads // max(1, tensor_parallel_size))
    per = shape.kv_factor * shape.num_layers * heads * shape.head_dim * dtype_bytes(cache_dtype, shape.model_dtype)
    return int(per)


@dataclass(frozen=True)
class KvCapacity:
    """How much KV a budget holds: whole blocks, and the tokens they hold."""

    num_blocks: int
    block_size: int
    bytes_per_token: int

    @property
    def tokens(self) -> int:
        """Token slots: num_blocks x block_size."""
        return self.num_blocks * self.block_size

    @property
    def bytes(self) -> int:
        """Bytes the blocks occupy."""
        return self.tokens * self.bytes_per_token


def capacity_from_bytes(kv_memory_bytes: int, bytes_per_token: int, block_size: int) -> KvCapacity:
    """Whole blocks that fit in a KV budget, as vLLM sizes its pool (available // bytes per block).

    (1 GiB, 4096 B/token, block 128) -> 2048 blocks = 262144 tokens.
    """
    if bytes_per_token <= 0 or block_size <= 0:
        raise ValueError("bytes_per_token and block_size must be positive")
    return KvCapacity(int(kv_memory_bytes) // (bytes_per_token * block_size), block_size, bytes_per_token)


def blocks_per_request(tokens: int, block_size: int, sliding_window: int | None = None) -> int:
    """Blocks one request of `tokens` tokens holds: ceil(tokens / block_size), capped by a sliding window.

    (4096, 16) -> 256; (4097, 16) -> 257; (32768, 16, window 4096) -> 257 (window blocks + 1 straddling,
    as vllm/v1/kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request).
    """
    full = math.ceil(tokens / block_size)
    if sliding_window:
        return min(full, math.ceil(sliding_window / block_size) + 1)
    return full


def max_concurrency(num_blocks: int, block_size: int, max_model_len: int, sliding_window: int | None = None) -> float:
    """Requests of max_model_len tokens the pool holds at once (vLLM's 'Maximum concurrency').

    (2048 blocks, 128, 2048) -> 128.0; (8, 128, 512) -> 2.0.
    """
    return num_blocks / blocks_per_request(max_model_len, block_size, sliding_window)


def kv_cache_size_tokens(num_blocks: int, block_size: int, max_model_len: int, sliding_window: int | None = None) -> int:
    """vLLM's reported `kv_cache_size_tokens`: int(max_concurrency x max_model_len). (2048, 128, 2048) -> 262144."""
    return int(max_concurrency(num_blocks, block_size, max_model_len, sliding_window) * max_model_len)


def safe_max_num_seqs(num_blocks: int, block_size: int, max_model_len: int, sliding_window: int | None = None) -> int:
    """Largest max_num_seqs at which every running request can reach max_model_len without preemption.

    (2048 blocks, 128, 2048) -> 128; (8, 128, 512) -> 2; 0 means not even one full-length request fits.
    """
    return int(math.floor(max_concurrency(num_blocks, block_size, max_model_len, sliding_window)))


def max_num_seqs_for_mean_tokens(capacity_tokens: int, mean_tokens_per_request: float, block_size: int,
                                 headroom: float = 0.9) -> int:
    """Sequences that fit when requests hold `mean_tokens_per_request` on average, keeping some headroom.

    Each request also wastes half a block on average in its last, partly filled block.
    (262144 tokens, mean 1000, block 128, headroom 0.9) -> floor(0.9*262144 / (1000+64)) = 221.
    """
    per = mean_tokens_per_request + block_size / 2
    if per <= 0:
        raise ValueError("mean_tokens_per_request must be positive")
    return max(1, int(math.floor(headroom * capacity_tokens / per)))


@dataclass(frozen=True)
class FragmentationEstimate:
    """Tokens the running requests hold vs the token slots of the blocks in use."""

    running: float
    mean_tokens_per_running: float
    tokens_held: float
    blocks_used: float
    block_size: int
    expected_last_block_waste: float  # running x (block_size - 1) / 2: unavoidable partial blocks

    @property
    def slots_held(self) -> float:
        """blocks_used x block_size."""
        return self.blocks_used * self.block_size

    @property
    def utilisation(self) -> float:
        """tokens_held / slots_held (1.0 = no waste); nan when no blocks are in use."""
        return self.tokens_held / self.slots_held if self.slots_held else float("nan")

    @property
    def wasted_slots(self) -> float:
        """Slots held beyond the tokens the requests need."""
        return max(0.0, self.slots_held - self.tokens_held)


def mean_running_tokens(mean_prompt_tokens: float, mean_generation_tokens: float) -> float:
    """Tokens a running request holds on average: its prompt plus half its output (it is mid-decode).

    (prompt sum/count 500, generation sum/count 200) -> 600.0
    """
    return mean_prompt_tokens + mean_generation_tokens / 2


def fragmentation_estimate(running: float, mean_prompt_tokens: float, mean_generation_tokens: float,
                           blocks_used: float, block_size: int) -> FragmentationEstimate:
    """Estimate of tokens actually held vs blocks held, for `kv_fragmentation`.

    running comes from max_over_time(num_requests_running), mean lengths from the
    request_prompt_tokens / request_generation_tokens histograms (rate of _sum / rate of _count),
    blocks_used from kv_cache_usage_perc x num_gpu_blocks.
    (running 10, prompt 500, generation 200, blocks_used 100, block 128) -> tokens_held 6000,
    slots_held 12800, utilisation 0.469.
    """
    per = mean_running_tokens(mean_prompt_tokens, mean_generation_tokens)
    return FragmentationEstimate(running, per, running * per, blocks_used, block_size,
                                 running * (block_size - 1) / 2)


def kv_budget_bytes(gpu_memory_bytes: int, gpu_memory_utilization: float, non_kv_bytes: int) -> int:
    """KV budget on a GPU: memory x utilisation minus what is not KV (weights, activations, graphs).

    (80 GiB, 0.9, 14 GiB) -> 58 GiB. vLLM measures the non-KV part by profiling; this is the estimate.
    """
    return max(0, int(gpu_memory_bytes * gpu_memory_utilization) - int(non_kv_bytes))


def fmt_bytes(n: float) -> str:
    """Human bytes, binary units: 524288 -> '512 KiB', 2147483648 -> '2 GiB', 4096 -> '4 KiB'."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class KvPlan:
    """`vllm-sentinel plan`'s answer: per-token and per-request KV, and what a budget holds."""

    shape: KvShape
    cache_dtype: str
    block_size: int
    max_model_len: int
    bytes_per_token: int
    kv_budget_bytes: int | None = None
    budget_note: str = ""

    @property
    def bytes_per_request(self) -> int:
        """KV of one request at max_model_len, in whole blocks."""
        return blocks_per_request(self.max_model_len, self.block_size, self.shape.sliding_window) \
            * self.block_size * self.bytes_per_token

    @property
    def capacity(self) -> KvCapacity | None:
        """Blocks and tokens the budget holds (None without a budget)."""
        if self.kv_budget_bytes is None:
            return None
        return capacity_from_bytes(self.kv_budget_bytes, self.bytes_per_token, self.block_size)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures (capacity fields None without a budget)."""
        cap = self.capacity
        conc = max_concurrency(cap.num_blocks, self.block_size, self.max_model_len, self.shape.sliding_window) if cap else None
        return {
            "architecture": {"model_type": self.shape.model_type, "num_layers": self.shape.num_layers,
                             "num_kv_heads": self.shape.num_kv_heads, "head_dim": self.shape.head_dim,
                             "model_dtype": self.shape.model_dtype, "mla": self.shape.is_mla,
                             "sliding_window": self.shape.sliding_window},
            "kv_cache_dtype": self.cache_dtype,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_block": self.bytes_per_token * self.block_size,
            "bytes_per_request_at_max_model_len": self.bytes_per_request,
            "kv_budget_bytes": self.kv_budget_bytes,
            "kv_budget_note": self.budget_note,
            "num_blocks": cap.num_blocks if cap else None,
            "capacity_tokens": cap.tokens if cap else None,
            "max_concurrency_at_max_model_len": round(conc, 2) if conc is not None else None,
            "kv_cache_size_tokens": kv_cache_size_tokens(cap.num_blocks, self.block_size, self.max_model_len,
                                                         self.shape.sliding_window) if cap else None,
            "safe_max_num_seqs": safe_max_num_seqs(cap.num_blocks, self.block_size, self.max_model_len,
                                                   self.shape.sliding_window) if cap else None,
        }


def make_plan(cfg: dict[str, Any], max_model_len: int | None = None, cache_dtype: str = "auto",
              block_size: int = 16, kv_budget_bytes: int | None = None, budget_note: str = "",
              tensor_parallel_size: int = 1) -> KvPlan:
    """A KvPlan from a config.json dict; max_model_len defaults to the config's, as vLLM derives it.

    Llama-2-7B, max_model_len 4096, 16 GiB budget, block 16 -> 0.5 MiB/token, 32768 tokens, 8 sequences.
    """
    shape = kv_shape_from_config(cfg)
    mml = max_model_len or shape.max_position_embeddings
    if not mml:
        raise ModelConfigError("config.json has no max_position_embeddings (or another length key); pass --max-model-len")
    if block_size <= 0:
        raise ValueError("block size must be positive")
    return KvPlan(shape, cache_dtype, block_size, int(mml), kv_bytes_per_token(shape, cache_dtype, tensor_parallel_size),
                  kv_budget_bytes, budget_note)
