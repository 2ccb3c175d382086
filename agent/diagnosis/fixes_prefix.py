"""Fixes for prefix caching that does not pay: turn it off, or route requests sharing a prefix together."""

from __future__ import annotations

from collections.abc import Mapping

from vllm_sentinel.agent.diagnosis.fix_inputs import cannot_compute, evidence_value, readable, signals
from vllm_sentinel.agent.diagnosis.fix_registry import Fix, register_fix
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

PREFIX_ROUTING = "prefix-aware routing, bounded by load (requests that share a prefix go to the replica that holds it)"
PREFIX_ROUTERS = ("vLLM production-stack's router: --routing-logic prefixaware; llm-d's inference scheduler: "
                  "its prefix-cache scorer")


def _hit_line(hit: float, prompt_rate: float | None) -> str:
    saved = f" ({readable(round(hit * prompt_rate))} of {readable(round(prompt_rate))} prompt tokens/s)" \
        if prompt_rate is not None else ""
    return f"{hit:.1%} of the prompt tokens looked up were found in the cache{saved}"


@register_fix("prefix_cache_ineffective", "prefix_cache_ineffective.enable_prefix_caching")
def prefix_cache_off(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Turn prefix caching off when it saves almost no prefill: the hashing and the cache churn cost more."""
    param = "--enable-prefix-caching"
    (hit,), absent = signals(evidence, "prefix_cache_hit_ratio")
    if absent:
        return cannot_compute(param, "true", cfg, [], "what the cache saves", absent)
    if cfg.get("enable_prefix_caching") is False:
        return None  # already off (the rule reads cache_config_info: a later restart turned it off)
    ratio = evidence_value(evidence, "prompt_to_output_ratio")
    share = evidence_value(evidence, "prefill_time_share")
    work = []
    if ratio is not None:
        work.append(f"prompts are {readable(round(ratio, 1))} tokens per generated token")
    if share is not None:
        work.append(f"prefill takes {share:.0%} of the requests' engine time")
    return Fix(param, "true", "false (--no-enable-prefix-caching)",
               f"{_hit_line(hit, evidence_value(evidence, 'prompt_tokens_per_second'))}"
               f"{'; ' + ' and '.join(work) if work else ''}: the prefill the cache saves is small, while every "
               "prompt block is still hashed and finished requests' blocks are kept until evicted. Off, the hit "
               "share is lost and the hashing is saved; if requests do share prefixes but spread over replicas, "
               "route them first (the router fix) and keep caching on")


@register_fix("prefix_cache_ineffective.router")
def prefix_cache_router(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """With several replicas, send requests that share a prefix to the same one, so its cache is hit."""
    param = "router policy"
    (hit, replicas), absent = signals(evidence, "prefix_cache_hit_ratio", "replicas")
    if absent:
        return cannot_compute(param, None, cfg, [], "whether routing spreads shared prefixes", absent)
    if replicas < 2:
        return None  # one replica holds every prefix already: routing cannot raise the hit rate
    n = int(replicas)
    return Fix(param, f"prefix-unaware ({n} replicas)", PREFIX_ROUTING,
               f"{_hit_line(hit, evidence_value(evidence, 'prompt_tokens_per_second'))}. With {n} replicas and "
               "routing that ignores prompts, each replica misses a shared prefix until it has seen it itself and "
               f"then keeps its own copy: up to {n} misses per prefix, and {n} copies taking blocks other prefixes "
               "could use. Prefix-aware routing sends requests that share a prefix to the replica that holds it "
               f"({PREFIX_ROUTERS}); bound it by load so one hot prefix cannot queue a replica")
