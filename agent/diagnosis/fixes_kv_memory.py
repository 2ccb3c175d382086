"""The memory side of kv_cache_pressure: more KV blocks for the requests the server runs, where memory allows.

Fewer sequences (--max-num-seqs) stop preemption by serving fewer requests at once; more KV blocks stop
it without shrinking the batch. The blocks the running requests need: the requests that ran or waited
(up to --max-num-seqs) x the whole blocks a request of the mean length holds (half a block more where
that is more), over a 0.9 headroom, plus vLLM's null block. Where those blocks come from:
- a `--num-gpu-blocks-override` below what the reserved KV memory holds: raise the override;
- on CPU, VLLM_CPU_KVCACHE_SPACE (GiB) large enough for them;
- on GPU, `--gpu-memory-utilization` up to what the measured GPU memory headroom allows;
- an fp8 KV cache halves the bytes per token of a 16-bit one (GPU only: the CPU backend keeps 16 bits).
Each returns None where it is not the lever (no override, another platform, no headroom).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from vllm_sentinel.agent.diagnosis import vllm_defaults
from vllm_sentinel.agent.diagnosis.fix_inputs import KV_HEADROOM, evidence_value, readable, request_tokens
from vllm_sentinel.agent.diagnosis.fix_registry import Fix, register_fix
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

GIB = 1024**3
# GPU memory a server may use at its peak (the same line the OOM fix keeps)
SAFE_GPU_MEMORY_RATIO = 0.95


def blocks_needed(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> tuple[int | None, str]:
    """KV blocks for every request that ran or waited (capped by --max-num-seqs), with the arithmetic."""
    per, per_how = request_tokens(cfg, evidence)
    bs = cfg.get("block_size")
    if per is None or not bs:
        return None, ""
    running = evidence_value(evidence, "running") or 0.0
    waiting = evidence_value(evidence, "waiting") or 0.0
    wanted = running + waiting
    seqs = cfg.get("max_num_seqs")
    if wanted <= 0 and seqs is None:
        return None, ""
    concurrent = int(min(wanted, seqs) if seqs and wanted > 0 else (wanted or seqs))
    # a request holds whole blocks: at least ceil(length / block) of them (exact for fixed lengths), and half
    # a block more than its mean where lengths spread
    per_request = max(math.ceil(per / bs), (per + bs / 2) / bs)
    blocks = math.ceil(concurrent * per_request / KV_HEADROOM) + 1
    capped = f", capped by --max-num-seqs {seqs}" if seqs and wanted > seqs else ""
    return blocks, (f"{concurrent} requests (at most {readable(round(running))} running + {readable(round(waiting))} "
                    f"waiting{capped}) x {per_request:.3g} blocks of {bs} tokens each ({per_how}) / "
                    f"{KV_HEADROOM} headroom + 1 null block = {readable(blocks)} blocks")


def _blocks_in_bytes(cfg: LiveConfig, n_bytes: float) -> int | None:
    per_token, bs = cfg.get("kv_bytes_per_token"), cfg.get("block_size")
    return int(n_bytes // (per_token * bs)) if per_token and bs else None


@register_fix("kv_cache_pressure.num_gpu_blocks_override")
def raise_blocks_override(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Raise --num-gpu-blocks-override to the blocks the requests need, within the KV memory already reserved."""
    current = cfg.get("num_gpu_blocks_override")
    if current is None:
        return None
    need, how = blocks_needed(cfg, evidence)
    room = _blocks_in_bytes(cfg, cfg.get("kv_cache_memory_bytes") or 0)
    if need is None or need <= current or not room or room <= current:
        return None
    suggested = min(need, room)
    limit = "" if suggested == need else f"; the reserved memory holds only {readable(room)}"
    return Fix("--num-gpu-blocks-override", str(current), str(suggested),
               f"{how}; the override caps the cache at {readable(current)} blocks while "
               f"{_gib(cfg.get('kv_cache_memory_bytes'))} of KV memory is reserved "
               f"({readable(room)} blocks of {readable(cfg.get('kv_bytes_per_token') * cfg.get('block_size'))} B){limit}")


@register_fix("kv_cache_pressure.cpu_kv_space")
def raise_cpu_kv_space(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """On CPU without an override: VLLM_CPU_KVCACHE_SPACE large enough for the blocks the requests need."""
    if cfg.get("platform") != vllm_defaults.PLATFORM_CPU or cfg.get("num_gpu_blocks_override") is not None:
        return None
    need, how = blocks_needed(cfg, evidence)
    have, per_token, bs = cfg.get("num_gpu_blocks"), cfg.get("kv_bytes_per_token"), cfg.get("block_size")
    if need is None or not per_token or not bs or (have is not None and need <= have):
        return None
    current_bytes = cfg.get("kv_cache_memory_bytes")
    gib = max(1, math.ceil(need * per_token * bs / GIB))
    current = None if current_bytes is None else f"{current_bytes / GIB:g}"
    if current is not None and gib <= float(current):
        return None
    return Fix("VLLM_CPU_KVCACHE_SPACE", current, str(gib),
               f"{how} x {readable(per_token * bs)} B a block = {_gib(need * per_token * bs)}, rounded up to {gib} GiB "
               "(an environment variable of the server: the host needs that much free memory)")


@register_fix("kv_cache_pressure.gpu_memory_utilization")
def raise_gpu_memory_utilization(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """On GPU: --gpu-memory-utilization up by the bytes the blocks need, within the measured memory headroom."""
    current = cfg.get("gpu_memory_utilization")
    total, used = evidence_value(evidence, "gpu_memory_total_bytes"), evidence_value(evidence, "gpu_memory_used_ratio")
    if cfg.get("platform") == vllm_defaults.PLATFORM_CPU or current is None or not total or used is None:
        return None
    if cfg.get("num_gpu_blocks_override") is not None:
        return None  # the override caps the cache whatever the utilisation: its own fix raises it
    need, how = blocks_needed(cfg, evidence)
    have, per_token, bs = cfg.get("num_gpu_blocks"), cfg.get("kv_bytes_per_token"), cfg.get("block_size")
    if need is None or have is None or not per_token or need <= have:
        return None
    extra = (need - have) * per_token * bs / total
    headroom = SAFE_GPU_MEMORY_RATIO - used
    step = min(extra, headroom)
    suggested = math.floor((current + step) * 100) / 100
    if step <= 0 or suggested <= current:
        return None
    short = "" if step >= extra else f"; the GPU's {headroom:.1%} headroom allows only part of it"
    return Fix("--gpu-memory-utilization", str(current), f"{suggested:.2f}",
               f"{how}: {readable(need - have)} more blocks x {readable(per_token * bs)} B = {extra:.1%} of "
               f"{_gib(total)}; GPU memory peaked at {used:.1%}, under the {SAFE_GPU_MEMORY_RATIO:.0%} safe line{short}")


@register_fix("kv_cache_pressure.kv_cache_dtype")
def fp8_kv_cache(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """On GPU with a 16-bit KV cache: fp8 holds twice the tokens in the same memory."""
    if cfg.get("platform") != vllm_defaults.PLATFORM_GPU or str(cfg.get("cache_dtype") or "auto") != "auto":
        return None
    if str(cfg.get("model_dtype") or "") not in ("bfloat16", "float16"):
        return None
    need, how = blocks_needed(cfg, evidence)
    have = cfg.get("num_gpu_blocks")
    if need is None or have is None or need <= have or need > 2 * have:
        return None
    return Fix("--kv-cache-dtype", "auto", "fp8",
               f"{how}; the cache holds {readable(have)}: fp8 halves the bytes per token of the "
               f"{cfg.get('model_dtype')} cache, {readable(2 * have)} blocks in the same memory (check the model's "
               "accuracy with an fp8 cache before serving it)")


def _gib(n: float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.3g} GiB"
