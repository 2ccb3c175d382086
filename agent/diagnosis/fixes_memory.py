"""Fixes for memory incidents: KV cache pressure, OOM risk, KV fragmentation."""

from __future__ import annotations

import math
from collections.abc import Mapping

from vllm_sentinel.agent.diagnosis import kvmath, vllm_defaults
from vllm_sentinel.agent.diagnosis.fix_inputs import (block_granularity_limit, cannot_compute, evidence_value,
                                                      kv_capacity, readable, request_tokens, seqs_that_fit, signals)
from vllm_sentinel.agent.diagnosis.fix_knob import knob_fix
from vllm_sentinel.agent.diagnosis.fix_registry import Fix, register_fix
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

# The smallest block each attention backend accepts, from the installed vLLM 0.32 source: the CPU backend's
# kernel takes multiples of 32 (v1/attention/backends/cpu_attn.py get_supported_kernel_block_sizes ->
# MultipleOf(32); platforms/cpu.py warns below that and defaults to 128); FlashAttention on CUDA takes
# multiples of 16 (v1/attention/backends/flash_attn.py -> MultipleOf(16), 16 being the GPU default).
# Where the platform is unknown, 32 is accepted by both.
SMALLEST_BLOCK = {vllm_defaults.PLATFORM_CPU: 32, vllm_defaults.PLATFORM_GPU: 16}
SMALLEST_BLOCK_ANY = 32

# GPU memory a server may use at its peak before a fragmentation or activation spike kills it
SAFE_GPU_MEMORY_RATIO = 0.95


# -- kv_cache_pressure -----------------------------------------------------------------------------

@register_fix("kv_cache_pressure", "kv_cache_pressure.max_num_seqs")
def kv_pressure_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-num-seqs to what the KV cache holds for the observed request lengths."""
    param, current = "--max-num-seqs", cfg.get("max_num_seqs")
    seqs, how, need = seqs_that_fit(cfg, evidence)
    if seqs is None:
        return cannot_compute(param, current, cfg, need, "how many sequences fit in the KV cache")
    if current is not None and seqs >= current:
        # the limit already fits the mean request: the long tail overflows; fall back to the full-length bound
        if cfg.known("max_model_len") and cfg.known("num_gpu_blocks"):
            safe = kvmath.safe_max_num_seqs(cfg.get("num_gpu_blocks"), cfg.get("block_size"), cfg.get("max_model_len"),
                                            cfg.get("sliding_window"))
            if 0 < safe < current:
                return Fix(param, str(current), str(safe),
                           f"{how}, above the current {current}, so long requests overflow: "
                           f"{readable(cfg.get('num_gpu_blocks'))} blocks / "
                           f"ceil({readable(cfg.get('max_model_len'))} / "
                           f"{cfg.get('block_size')}) blocks per max-length request = {safe} sequences never preempt")
        return None
    cur = "unknown" if current is None else str(current)
    pressure = ""
    if current is not None:
        per, _ = request_tokens(cfg, evidence)
        cap, _ = kv_capacity(cfg)
        pressure = (f"; at --max-num-seqs {current} the running requests need up to {readable(round(current * per))} "
                    f"tokens, {current * per / cap:.0%} of capacity, so the scheduler preempts")
    why = f"{how}{pressure}"
    if current is None:
        why += f" (current value unknown: {cfg.source('max_num_seqs')})"
    return Fix(param, None if current is None else str(current), str(seqs), why)


# -- oom_risk ----------------------------------------------------------------------------------------

@register_fix("oom_risk", "oom_risk.gpu_memory_utilization")
@knob_fix("gpu_memory_utilization", "a lower utilisation", "gpu_memory_used_ratio")
def oom_gpu_memory_utilization(cfg: LiveConfig, evidence: Mapping[str, float | None], param: str, current: float,
                               used: float) -> Fix | None:
    """Lower --gpu-memory-utilization by the amount the peak exceeds a safe share of GPU memory."""
    over = used - SAFE_GPU_MEMORY_RATIO
    if over <= 0:
        return None
    suggested = math.floor((current - over) * 100) / 100
    if suggested <= 0.1:
        return None
    why = (f"GPU memory peaked at {used:.1%} of total, {over:.1%} above the {SAFE_GPU_MEMORY_RATIO:.0%} safe line; "
           f"{current} - {over:.3f} = {suggested}")
    total = evidence_value(evidence, "gpu_memory_total_bytes")
    bpt = cfg.get("kv_bytes_per_token")
    if total and bpt:
        why += f" (costs about {readable(int((current - suggested) * total / bpt))} KV tokens of capacity)"
    return Fix(param, str(current), f"{suggested:.2f}", why)


@register_fix("oom_risk.max_model_len")
def oom_max_model_len(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-model-len so max_num_seqs requests of that length fit the KV cache."""
    param, current = "--max-model-len", cfg.get("max_model_len")
    seqs = cfg.get("max_num_seqs")
    cap, cap_how = kv_capacity(cfg)
    if current is None or seqs is None or cap is None:
        return cannot_compute(param, current, cfg, ["max_model_len", "max_num_seqs", "num_gpu_blocks", "block_size"],
                        "a max_model_len that fits")
    if current * seqs <= cap:
        return None
    bs = int(cfg.get("block_size", 16))
    suggested = (cap // seqs) // bs * bs
    p, g = evidence_value(evidence, "mean_prompt_tokens"), evidence_value(evidence, "mean_generation_tokens")
    if suggested < bs or (p is not None and g is not None and suggested < p + g):
        return None  # the traffic itself needs longer requests: lower max_num_seqs instead
    return Fix(param, str(current), str(suggested),
               f"--max-num-seqs {seqs} x max_model_len {readable(current)} = {readable(current * seqs)} tokens > KV "
               "capacity "
               f"{readable(cap)} ({cap_how}); {readable(cap)} / {seqs}, rounded down to the block size {bs} = "
               f"{readable(suggested)}")


# -- kv_fragmentation --------------------------------------------------------------------------------

@register_fix("kv_fragmentation", "kv_fragmentation.block_size")
def fragmentation_block_size(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """The smallest --block-size the platform accepts, when partly filled last blocks explain the unused KV slots."""
    param, bs = "--block-size", cfg.get("block_size")
    (running, usage, p, g), ev_missing = signals(evidence, "running", "kv_usage", "mean_prompt_tokens",
                                                 "mean_generation_tokens")
    if bs is None or not cfg.known("num_gpu_blocks") or ev_missing:
        return cannot_compute(param, bs, cfg, ["block_size", "num_gpu_blocks"], "the block size", ev_missing)
    blocks = cfg.get("num_gpu_blocks")
    # vLLM keeps one block as its null block and reads usage over the rest (v1/core/block_pool.py get_usage)
    est = kvmath.fragmentation_estimate(running, p, g, usage * (blocks - 1), bs)
    smallest = SMALLEST_BLOCK.get(cfg.get("platform"), SMALLEST_BLOCK_ANY)
    if bs <= smallest or est.wasted_slots <= 0:
        return None
    # expected use with the smaller block: the same tokens, last-block waste shrinks with the block
    new_waste = running * (smallest - 1) / 2
    new_util = est.tokens_held / (est.tokens_held + new_waste) if est.tokens_held else 1.0
    per = est.mean_tokens_per_running
    # the same memory in smaller blocks: how many requests of this length it holds at once
    fit_now = (blocks - 1) // math.ceil(per / bs)
    fit_new = (blocks * bs // smallest - 1) // math.ceil(per / smallest)
    return Fix(param, str(bs), str(smallest),
               f"{readable(round(running))} running requests hold about {readable(round(est.tokens_held))} tokens "
               f"({readable(round(per))} each: prompt {readable(round(p))} + half of "
               f"{readable(round(g))} output) "
               f"in {readable(round(est.blocks_used))} blocks x {bs} = {readable(round(est.slots_held))} slots, "
               f"{est.utilisation:.0%} used; the partly filled last blocks alone waste "
               f"~{readable(round(est.expected_last_block_waste))} "
               f"slots, with block {smallest} ~{readable(round(new_waste))} ({new_util:.0%} of held slots used). "
               f"The same {readable(blocks * bs)} slots hold {readable(fit_now)} such requests at once in {bs}-token "
               f"blocks, {readable(fit_new)} in {smallest}-token blocks ({smallest} is the smallest block "
               f"{cfg.get('platform') or 'every platform'} accepts; a --num-gpu-blocks-override counts blocks: "
               f"scale it by {bs // smallest})")


@register_fix("kv_fragmentation.max_num_seqs")
def fragmentation_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Say why a higher --max-num-seqs cannot help while block granularity caps concurrency."""
    blocked_by = block_granularity_limit(cfg, evidence)
    if blocked_by is None:
        return None
    current = cfg.get("max_num_seqs")
    return Fix("--max-num-seqs", None if current is None else str(current), None,
               f"leave it: {blocked_by}; raising it admits nobody more, a smaller --block-size does")
