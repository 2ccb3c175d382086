"""Fixes for scheduling incidents: queueing, prefill blocking, under-batching, latency objectives, stalls."""

from __future__ import annotations

import math
from collections.abc import Mapping

from vllm_sentinel.agent.diagnosis.fix_inputs import (MAX_BATCHED_TOKENS, block_granularity_limit, cannot_compute,
                                                      evidence_value, readable, round_down, seqs_that_fit, signals)
from vllm_sentinel.agent.diagnosis.fix_knob import knob_fix
from vllm_sentinel.agent.diagnosis.fix_registry import Fix, register_fix
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig
from vllm_sentinel.agent.diagnosis.routing import cdf_from_quantiles, split_by_length

# -- queue_blocking --------------------------------------------------------------------------------

@register_fix("queue_blocking", "queue_blocking.max_num_seqs")
def queue_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Raise --max-num-seqs when the KV cache has room for more sequences (else see queue_blocking.replicas)."""
    param, current = "--max-num-seqs", cfg.get("max_num_seqs")
    if current is None:
        return cannot_compute(param, None, cfg, ["max_num_seqs"], "a higher --max-num-seqs")
    seqs, how, need = seqs_that_fit(cfg, evidence)
    if seqs is None:
        return cannot_compute(param, current, cfg, need, "whether the KV cache has room for more sequences")
    if seqs <= current:
        blocked_by = block_granularity_limit(cfg, evidence)
        if blocked_by:  # say why the obvious knob is the wrong one: the queue comes from the block size
            return Fix(param, str(current), None, f"not raised: {blocked_by}; a smaller --block-size lets more run "
                                                  "(see kv_fragmentation)")
        return None  # no KV headroom: more sequences would only be preempted; replicas are the fix
    waiting = evidence_value(evidence, "waiting")
    target = min(seqs, 2 * current)  # at most double per change: watch TPOT before going further
    if waiting is not None:
        target = min(target, max(current + 1, current + math.ceil(waiting)))
    return Fix(param, str(current), str(target),
               f"requests wait while {current} sequences run; {how}, so there is KV room for more; "
               f"{'waiting ' + readable(waiting) + ', ' if waiting is not None else ''}"
               f"raised to {target} (at most double per change; watch TPOT)")


@register_fix("queue_blocking.replicas")
def queue_replicas(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Add replicas when the queue is longer than the KV cache can take in."""
    param = "replicas"
    replicas = evidence_value(evidence, "replicas") or 1.0
    running = evidence_value(evidence, "running")
    (waiting,), absent = signals(evidence, "waiting")
    current = cfg.get("max_num_seqs")
    seqs, how, _ = seqs_that_fit(cfg, evidence)
    per_replica = min(x for x in (current, seqs) if x is not None) if (current or seqs) else None
    if per_replica is None or waiting is None:
        return cannot_compute(param, int(replicas), cfg, [] if per_replica else ["max_num_seqs"],
                              "how many replicas the queue needs", absent)
    demand = (running if running is not None else per_replica * replicas) + waiting
    needed = max(int(replicas) + 1, math.ceil(demand / per_replica))
    if seqs is not None and current is not None and seqs > current:
        return None  # raising --max-num-seqs comes first (queue_blocking.max_num_seqs)
    return Fix(param, str(int(replicas)), str(needed),
               f"demand {readable(round(demand))} requests (running {readable(running or 0)} + waiting "
               f"{readable(waiting)}) / "
               f"{per_replica} sequences per replica = {needed} replicas"
               + (f"; {how}" if how else ""))


# -- prefill_hol_blocking --------------------------------------------------------------------------

@register_fix("prefill_hol_blocking", "prefill_hol_blocking.max_num_batched_tokens")
def prefill_max_num_batched_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-num-batched-tokens so one long prompt's chunk cannot fill a whole step."""
    param, current = "--max-num-batched-tokens", cfg.get("max_num_batched_tokens")
    if current is None:
        return cannot_compute(param, None, cfg, ["max_num_batched_tokens"], "a smaller step budget")
    if cfg.get("enable_chunked_prefill") is False:
        return None  # without chunking the budget must hold a whole prompt: enable chunked prefill first
    floor = max(512, int(cfg.get("max_num_seqs", 0)))  # vLLM requires >= max_num_seqs
    suggested = max(floor, round_down(current / 2, 256))
    if suggested >= current:
        return None
    p95 = evidence_value(evidence, "iteration_tokens_p95")
    seen = f"step tokens p95 {readable(round(p95))} of the {readable(current)} budget: " if p95 is not None else ""
    return Fix(param, str(current), str(suggested),
               f"{seen}long prompts fill whole steps and stall decode of the running requests; half the budget "
               f"({readable(current)} / 2, multiple of 256, at least max(512, max_num_seqs "
               f"{cfg.get('max_num_seqs', '?')}))"
               f" = {readable(suggested)} tokens per step bounds that stall")


@register_fix("prefill_hol_blocking.chunked_prefill")
def prefill_chunked(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Enable chunked prefill when it is off."""
    param, current = "--enable-chunked-prefill", cfg.get("enable_chunked_prefill")
    if current is None:
        return cannot_compute(param, None, cfg, ["enable_chunked_prefill"], "whether chunked prefill is on")
    if current:
        return None
    return Fix(param, "false", "true",
               f"chunked prefill is off ({cfg.source('enable_chunked_prefill')}): each prompt is prefilled in one "
               f"step of up to {readable(cfg.get('max_num_batched_tokens', 0))} tokens while decode waits; chunking "
               "interleaves it with decode")


@register_fix("prefill_hol_blocking.long_prefill_token_threshold")
def prefill_long_threshold(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Cap one long prompt's share of a step with --long-prefill-token-threshold."""
    param, current = "--long-prefill-token-threshold", cfg.get("long_prefill_token_threshold")
    budget = cfg.get("max_num_batched_tokens")
    if budget is None:
        return cannot_compute(param, current, cfg, ["max_num_batched_tokens"], "a threshold")
    bs = int(cfg.get("block_size", 16))
    suggested = round_down(budget / 4, bs)
    if current and current <= suggested:
        return None
    return Fix(param, str(current if current is not None else 0), str(suggested),
               f"a long prompt may take the whole {readable(budget)}-token step "
               f"({'no cap' if not current else f'cap {current}'}); "
               f"a quarter of it ({readable(budget)} / 4, multiple of block size {bs}) = {readable(suggested)} "
               "leaves room for "
               "short prompts in every step")


# quantiles of the prompt-length histogram a rule's evidence carries (signal prompt_tokens_pNN)
PROMPT_QUANTILE_SIGNALS = {0.25: "prompt_tokens_p25", 0.5: "prompt_tokens_p50", 0.75: "prompt_tokens_p75",
                           0.9: "prompt_tokens_p90", 0.95: "prompt_tokens_p95", 0.99: "prompt_tokens_p99"}


@register_fix("prefill_hol_blocking.length_routing")
def prefill_length_routing(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Split traffic into a short and a long pool by prompt length when the lengths are bimodal."""
    param = "routing"
    quantiles = {q: evidence_value(evidence, name) for q, name in PROMPT_QUANTILE_SIGNALS.items()}
    (ratio,), absent = signals(evidence, "prompt_spread_ratio")
    absent += [name for q, name in PROMPT_QUANTILE_SIGNALS.items() if q in (0.5, 0.95) and quantiles[q] is None]
    if absent:
        return cannot_compute(param, "one pool", cfg, [], "a length split", absent)
    split = split_by_length(cdf_from_quantiles(quantiles), ratio, budget=cfg.get("max_num_batched_tokens"),
                            block_size=int(cfg.get("block_size", 16)),
                            min_budget=max(512, int(cfg.get("max_num_seqs", 0))))
    if split is None:
        return None  # one mode, or a pool too small to be worth its own replicas
    return Fix(param, "one pool for all prompt lengths", split.summary(),
               f"{split.method} (from the prompt-length quantiles p25..p99); {split.effect}")


# -- underbatched ------------------------------------------------------------------------------------

@register_fix("underbatched", "underbatched.max_num_batched_tokens")
@knob_fix("max_num_batched_tokens", "a larger step budget", "iteration_tokens_p95")
def underbatched_batched_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None], param: str, current: int,
                                p95: float) -> Fix | None:
    """Raise --max-num-batched-tokens when steps are capped by it while the device idles."""
    if p95 < 0.9 * current or current >= MAX_BATCHED_TOKENS:
        return None
    suggested = min(MAX_BATCHED_TOKENS, current * 2)
    return Fix(param, str(current), str(suggested),
               f"step tokens p95 {readable(round(p95))} reach the {readable(current)} budget while the device is "
               "under-used; "
               f"doubling it ({readable(current)} x 2, at most {readable(MAX_BATCHED_TOKENS)}) = "
               f"{readable(suggested)} lets each step batch more")


@register_fix("underbatched.replicas")
def underbatched_replicas(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Fold traffic into fewer replicas when each runs far below its --max-num-seqs."""
    param = "replicas"
    (replicas, running), absent = signals(evidence, "replicas", "running")
    seqs = cfg.get("max_num_seqs")
    if absent or seqs is None:
        return cannot_compute(param, replicas, cfg, ["max_num_seqs"], "a replica count", absent)
    target = max(1, math.ceil(replicas * running / (0.7 * seqs)))
    if target >= replicas:
        return None
    return Fix(param, str(int(replicas)), str(target),
               f"each of {int(replicas)} replicas runs at most {readable(round(running))} of {seqs} sequences; "
               f"{int(replicas)} x {readable(round(running))} / (70% of {seqs}) = {target} replicas carry the same "
               "traffic")


# -- latency objectives ------------------------------------------------------------------------------

@register_fix("tpot_slo_breach", "tpot_slo_breach.max_num_seqs")
def tpot_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-num-seqs so decode steps, which grow with the batch, meet the TPOT objective."""
    param, current = "--max-num-seqs", cfg.get("max_num_seqs")
    (tpot, slo, running), ev_missing = signals(evidence, "tpot_p95_seconds", "tpot_slo_seconds", "running")
    if ev_missing or not tpot or not slo:
        return cannot_compute(param, current, cfg, [], "a batch size that meets the objective",
                              ev_missing or ["tpot_p95_seconds"])
    if tpot <= slo:
        return None
    batch = running if running and running > 0 else float(current or 1)
    suggested = max(1, math.floor(batch * slo / tpot))
    if current is not None and suggested >= current:
        return None
    return Fix(param, None if current is None else str(current), str(suggested),
               f"TPOT p95 {tpot * 1000:.0f} ms > objective {slo * 1000:.0f} ms at up to {readable(round(batch))} "
               "running; "
               f"decode step time grows about linearly with the batch: {readable(round(batch))} x {slo * 1000:.0f} / "
               f"{tpot * 1000:.0f} = {suggested} sequences")


@register_fix("ttft_slo_breach", "ttft_slo_breach.max_num_seqs")
def ttft_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """When queueing makes most of TTFT, admit more sequences if the KV cache allows (as queue_blocking)."""
    (ttft, queue), absent = signals(evidence, "ttft_p95_seconds", "queue_time_p95_seconds")
    if absent:
        return cannot_compute("--max-num-seqs", cfg.get("max_num_seqs"), cfg, [], "where TTFT goes", absent)
    if queue < 0.5 * ttft:
        return None  # prefill, not queueing, dominates: see ttft_slo_breach.max_num_batched_tokens
    f = queue_max_num_seqs(cfg, evidence)
    if f is not None and f.concrete:
        f.why = f"queueing is {queue / ttft:.0%} of TTFT p95 ({queue:.2f} s of {ttft:.2f} s); " + f.why
    return f


@register_fix("ttft_slo_breach.max_num_batched_tokens")
@knob_fix("max_num_batched_tokens", "a step budget", "mean_prompt_tokens")
def ttft_batched_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None], param: str, current: int,
                        prompt: float) -> Fix | None:
    """When prefill dominates TTFT and a mean prompt needs several steps, raise the step budget to hold one."""
    if prompt <= current or current >= MAX_BATCHED_TOKENS:
        return None
    suggested = min(MAX_BATCHED_TOKENS, math.ceil(prompt / 1024) * 1024)
    steps = math.ceil(prompt / current)
    return Fix(param, str(current), str(suggested),
               f"a mean prompt of {readable(round(prompt))} tokens takes {steps} steps of {readable(current)}; "
               f"{readable(suggested)} (the prompt rounded up to 1024, at most {readable(MAX_BATCHED_TOKENS)}) "
               "prefills it in one")


# -- engine_stall ----------------------------------------------------------------------------------

# vLLM 0.32 envs.py: VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, how long the multiprocess executor waits for
# one model step before it fails the engine (v1/executor/multiproc_executor.py uses it)
EXECUTE_MODEL_TIMEOUT_DEFAULT_S = 300
STALL_TIMEOUT_FLOOR_S = 60


@register_fix("engine_stall")
def stall_execute_timeout(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Shorten vLLM's step timeout so a hung step fails (and gets restarted) instead of hanging for minutes."""
    param = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
    current = cfg.get("execute_model_timeout_s", EXECUTE_MODEL_TIMEOUT_DEFAULT_S)
    itl = evidence_value(evidence, "itl_p99_seconds")
    # far above any healthy step: ten times the slowest inter-token gap seen, never under a minute
    suggested = max(STALL_TIMEOUT_FLOOR_S, math.ceil(10 * itl) if itl else 0)
    if suggested >= current:
        return None
    basis = (f"10 x the p99 inter-token latency {itl:.3g} s, at least {STALL_TIMEOUT_FLOOR_S} s" if itl
             else f"at least {STALL_TIMEOUT_FLOOR_S} s, far above a healthy step")
    return Fix(param, str(current), str(suggested),
               f"the engine made no progress with requests in flight; vLLM waits {current} s for a hung step "
               f"before it fails the engine. {suggested} s ({basis}) turns a hang into a crash that the "
               "orchestrator restarts, and the requests fail fast instead of waiting; capture the EngineCore "
               "stacks first (vllm-sentinel capture) to see where it waits")
