"""What fix computations read: evidence values, KV capacity, request lengths, and the message when one is missing."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vllm_sentinel.agent.diagnosis import kvmath
from vllm_sentinel.agent.diagnosis.fix_registry import Fix
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

# keep a tenth of the KV cache free: requests grow while they decode, and preemption is expensive
KV_HEADROOM = 0.9
# vLLM's maximum practical step budget (the largest default, engine/arg_utils.py:2923)
MAX_BATCHED_TOKENS = 16384


def round_down(x: float, step: int) -> int:
    """x down to a multiple of `step`, at least `step`: round_down(1000, 256) -> 768."""
    return max(step, int(x // step) * step)


def round_up(x: float, step: int) -> int:
    """x up to a multiple of `step`, at least `step`: round_up(1000, 256) -> 1024."""
    return max(step, -(-int(math.ceil(x)) // step) * step)


def evidence_value(evidence: Mapping[str, float | None], name: str) -> float | None:
    """The evidence signal's value, None when it is absent or not a finite number."""
    v = evidence.get(name)
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return None
    return float(v)


def signals(evidence: Mapping[str, float | None], *names: str) -> tuple[list[float | None], list[str]]:
    """The named evidence values in order (each as evidence_value reads it), and the names of the missing ones."""
    values = [evidence_value(evidence, n) for n in names]
    return values, [n for n, v in zip(names, values) if v is None]


def readable(x: float) -> str:
    """Readable number: 262144 -> '262,144', 0.5 -> '0.5', 1234.5678 -> '1,234.6'."""
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:.3g}"


def cannot_compute(param: str, current: Any, cfg: LiveConfig, need: list[str], what: str,
                   evidence_missing: list[str] = ()) -> Fix:
    """A Fix without a suggestion, naming the configuration values and evidence signals it lacks."""
    miss = cfg.missing(*need) + [f"evidence {e} (add it to the rule's evidence)" for e in evidence_missing]
    return Fix(param, None if current is None else str(current), None,
               f"cannot compute {what}: missing " + "; ".join(miss), miss)


def kv_capacity(cfg: LiveConfig) -> tuple[int | None, str]:
    """KV capacity in tokens and how it is known."""
    if cfg.known("num_gpu_blocks") and cfg.known("block_size"):
        # vLLM keeps one block as its null block (v1/core/block_pool.py): requests share the others. Next to
        # thousands of blocks it is nothing; in a small pool it is a request's worth (8 blocks hold 7 in use)
        usable = max(0, int(cfg.get("num_gpu_blocks")) - 1)
        return usable * int(cfg.get("block_size")), \
            f"{readable(usable)} usable blocks (one of {readable(cfg.get('num_gpu_blocks'))} is vLLM's null block) " \
            f"x {cfg.get('block_size')} tokens"
    if cfg.known("kv_cache_memory_bytes") and cfg.known("kv_bytes_per_token") and cfg.known("block_size"):
        cap = kvmath.capacity_from_bytes(cfg.get("kv_cache_memory_bytes"), cfg.get("kv_bytes_per_token"),
                                         cfg.get("block_size"))
        return cap.tokens, (f"{kvmath.fmt_bytes(cfg.get('kv_cache_memory_bytes'))} / "
                            f"{readable(cfg.get('kv_bytes_per_token'))} B per token")
    return None, ""


def request_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> tuple[float | None, str]:
    """Tokens one request holds at its end: mean prompt + mean output, else max_model_len."""
    p, g = evidence_value(evidence, "mean_prompt_tokens"), evidence_value(evidence, "mean_generation_tokens")
    if p is not None and g is not None and p + g > 0:
        return p + g, f"mean {readable(round(p))} prompt + {readable(round(g))} output tokens"
    if cfg.known("max_model_len"):
        max_len = cfg.get("max_model_len")
        return float(max_len), f"max_model_len {readable(max_len)} (request lengths unknown)"
    return None, ""


def seqs_that_fit(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> tuple[int | None, str, list[str]]:
    """max_num_seqs the KV cache holds for this traffic, with the arithmetic; missing inputs otherwise."""
    cap, cap_how = kv_capacity(cfg)
    per, per_how = request_tokens(cfg, evidence)
    if cap is None or per is None:
        need = [] if cap is not None else ["num_gpu_blocks", "block_size"]
        if per is None:
            need.append("max_model_len")
        return None, "", need
    bs = int(cfg.get("block_size", 16))
    seqs = kvmath.max_num_seqs_for_mean_tokens(cap, per, bs, KV_HEADROOM)
    how = (f"KV capacity {readable(cap)} tokens ({cap_how}) x {KV_HEADROOM} headroom / "
           f"({per_how} + {bs // 2} for the partly filled last block) = {seqs} sequences")
    return seqs, how, []


# the cache counts as full from here (vLLM's usage excludes its null block, so a full cache reads 1.0)
KV_FULL = 0.9


def block_granularity_limit(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> str | None:
    """Why blocks, not sequences, cap concurrency now; None unless the cache is full of requests under half a block.

    A running request holds its prompt plus about half its output; below half a block, the empty part
    of its last block is most of what it holds, and a full cache admits nobody more whatever
    --max-num-seqs says. (usage 1.0, running 7, prompt 16, output 16, block 128) -> 'the KV cache is
    100% used by 7 running requests of ~24 tokens in 128-token blocks ...'.
    """
    (usage, running, p, g), absent = signals(evidence, "kv_usage", "running", "mean_prompt_tokens",
                                             "mean_generation_tokens")
    bs = cfg.get("block_size")
    if absent or bs is None or usage < KV_FULL or not running:
        return None
    per = kvmath.mean_running_tokens(p, g)
    if per >= bs / 2:
        return None
    blocks = f"{readable(cfg.get('num_gpu_blocks'))} blocks" if cfg.known("num_gpu_blocks") else "the blocks"
    return (f"the KV cache is {usage:.0%} used by {readable(round(running))} running requests of ~{readable(round(per))} "
            f"tokens in {bs}-token blocks ({per / bs:.0%} of each held block used): the scheduler admits a request "
            f"only when a free block exists, so {blocks}, not --max-num-seqs, cap how many run")
