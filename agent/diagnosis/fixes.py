"""Fix computations: from a live configuration and an incident's evidence, a concrete parameter change.

Each function is registered under a name a rule file uses in `fix: [{param: ..., compute: NAME}]`
(agent/diagnosis/incidents.py imports this module and calls them through its `register_fix` hook). A fix
names the parameter, the current value, a concrete suggested value and the arithmetic in `why`;
when a value it needs is unknown it says which source is missing instead of suggesting
anything. None means "this parameter is not the lever here" (no advice).

Evidence values are read by signal name (a rule's `evidence: [{signal: NAME, expr: ...}]`):

| signal | meaning (suggested PromQL) |
|---|---|
| mean_prompt_tokens | rate(vllm:request_prompt_tokens_sum[5m]) / rate(..._count[5m]) |
| mean_generation_tokens | rate(vllm:request_generation_tokens_sum[5m]) / rate(..._count[5m]) |
| running | max_over_time(vllm:num_requests_running[5m]) |
| waiting | max_over_time(vllm:num_requests_waiting[5m]) |
| kv_usage | max_over_time(vllm:kv_cache_usage_perc[5m]) (0..1) |
| queue_time_p95_seconds, ttft_p95_seconds, tpot_p95_seconds | histogram_quantile(0.95, ...) |
| ttft_slo_seconds, tpot_slo_seconds | the configured objective (the rule's threshold) |
| iteration_tokens_p95 | histogram_quantile(0.95, rate(vllm:iteration_tokens_total_bucket[5m])) |
| gpu_memory_used_ratio | max_over_time(DCGM_FI_DEV_FB_USED / (FB_USED + FB_FREE)) (0..1) |
| replicas | instances serving the same model (count by model_name(up)) |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_sentinel.agent.diagnosis import kvmath
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

# keep a tenth of the KV cache free: requests grow while they decode, and preemption is expensive
KV_HEADROOM = 0.9
# GPU memory a server may use at its peak before a fragmentation or activation spike kills it
SAFE_GPU_MEMORY_RATIO = 0.95
# vLLM's maximum practical step budget (the largest default, engine/arg_utils.py:2923)
MAX_BATCHED_TOKENS = 16384


@dataclass
class Fix:
    """A parameter change: current -> suggested, with the arithmetic; `missing` lists unknown inputs."""

    param: str
    current: str | None
    suggested: str | None
    why: str
    missing: list[str] = field(default_factory=list)

    @property
    def concrete(self) -> bool:
        """True when it carries a suggested value."""
        return self.suggested is not None

    def as_dict(self) -> dict[str, str | None]:
        """The shape of a fix in `diagnose --format json`."""
        return {"param": self.param, "current": self.current, "suggested": self.suggested, "why": self.why}


FixFn = Callable[[LiveConfig, Mapping[str, float | None]], "Fix | None"]
FIXES: dict[str, FixFn] = {}


def fix(name: str) -> Callable[[FixFn], FixFn]:
    """Register a fix computation under `name` (the rule files' `compute:` value)."""
    def deco(fn: FixFn) -> FixFn:
        FIXES[name] = fn
        return fn
    return deco


def compute(name: str, cfg: LiveConfig | Mapping[str, Any], evidence: Mapping[str, float | None]) -> Fix | None:
    """Run the fix named `name`; a plain mapping is taken as a configuration snapshot's values."""
    if not isinstance(cfg, LiveConfig):
        cfg = as_live_config(cfg)
    return FIXES[name](cfg, evidence)


def as_live_config(values: Mapping[str, Any], instance: str = "") -> LiveConfig:
    """A LiveConfig from a plain mapping of values (sources: 'configuration snapshot')."""
    if isinstance(values, LiveConfig):
        return values
    return LiveConfig(instance, dict(values), {k: "configuration snapshot" for k, v in values.items() if v is not None})


# -- helpers ---------------------------------------------------------------------------------------

def _num(evidence: Mapping[str, float | None], name: str) -> float | None:
    v = evidence.get(name)
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return None
    return float(v)


def _n(x: float) -> str:
    """Readable number: 262144 -> '262,144', 0.5 -> '0.5', 1234.5678 -> '1,234.6'."""
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _missing(param: str, current: Any, cfg: LiveConfig, need: list[str], what: str,
             evidence_missing: list[str] = ()) -> Fix:
    miss = cfg.missing(*need) + [f"evidence {e} (add it to the rule's evidence)" for e in evidence_missing]
    return Fix(param, None if current is None else str(current), None,
               f"cannot compute {what}: missing " + "; ".join(miss), miss)


def _capacity(cfg: LiveConfig) -> tuple[int | None, str]:
    """KV capacity in tokens and how it is known."""
    if cfg.known("num_gpu_blocks") and cfg.known("block_size"):
        return int(cfg.get("num_gpu_blocks")) * int(cfg.get("block_size")), \
            f"{_n(cfg.get('num_gpu_blocks'))} blocks x {cfg.get('block_size')} tokens"
    if cfg.known("kv_cache_memory_bytes") and cfg.known("kv_bytes_per_token") and cfg.known("block_size"):
        cap = kvmath.capacity_from_bytes(cfg.get("kv_cache_memory_bytes"), cfg.get("kv_bytes_per_token"),
                                         cfg.get("block_size"))
        return cap.tokens, (f"{kvmath.fmt_bytes(cfg.get('kv_cache_memory_bytes'))} / "
                            f"{_n(cfg.get('kv_bytes_per_token'))} B per token")
    return None, ""


def _request_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> tuple[float | None, str]:
    """Tokens one request holds at its end: mean prompt + mean output, else max_model_len."""
    p, g = _num(evidence, "mean_prompt_tokens"), _num(evidence, "mean_generation_tokens")
    if p is not None and g is not None and p + g > 0:
        return p + g, f"mean {_n(round(p))} prompt + {_n(round(g))} output tokens"
    if cfg.known("max_model_len"):
        return float(cfg.get("max_model_len")), f"max_model_len {_n(cfg.get('max_model_len'))} (request lengths unknown)"
    return None, ""


def _seqs_that_fit(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> tuple[int | None, str, list[str]]:
    """max_num_seqs the KV cache holds for this traffic, with the arithmetic; missing inputs otherwise."""
    cap, cap_how = _capacity(cfg)
    per, per_how = _request_tokens(cfg, evidence)
    if cap is None or per is None:
        need = [] if cap is not None else ["num_gpu_blocks", "block_size"]
        if per is None:
            need.append("max_model_len")
        return None, "", need
    bs = int(cfg.get("block_size", 16))
    seqs = kvmath.max_num_seqs_for_mean_tokens(cap, per, bs, KV_HEADROOM)
    how = (f"KV capacity {_n(cap)} tokens ({cap_how}) x {KV_HEADROOM} headroom / "
           f"({per_how} + {bs // 2} for the partly filled last block) = {seqs} sequences")
    return seqs, how, []


# -- kv_cache_pressure -----------------------------------------------------------------------------

@fix("kv_cache_pressure")
@fix("kv_cache_pressure.max_num_seqs")
def kv_pressure_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-num-seqs to what the KV cache holds for the observed request lengths."""
    param, current = "--max-num-seqs", cfg.get("max_num_seqs")
    seqs, how, need = _seqs_that_fit(cfg, evidence)
    if seqs is None:
        return _missing(param, current, cfg, need, "how many sequences fit in the KV cache")
    if current is not None and seqs >= current:
        # the limit already fits the mean request: the long tail overflows; fall back to the full-length bound
        if cfg.known("max_model_len") and cfg.known("num_gpu_blocks"):
            safe = kvmath.safe_max_num_seqs(cfg.get("num_gpu_blocks"), cfg.get("block_size"), cfg.get("max_model_len"),
                                            cfg.get("sliding_window"))
            if 0 < safe < current:
                return Fix(param, str(current), str(safe),
                           f"{how}, above the current {current}, so long requests overflow: "
                           f"{_n(cfg.get('num_gpu_blocks'))} blocks / ceil({_n(cfg.get('max_model_len'))} / "
                           f"{cfg.get('block_size')}) blocks per max-length request = {safe} sequences never preempt")
        return None
    cur = "unknown" if current is None else str(current)
    pressure = ""
    if current is not None:
        per, _ = _request_tokens(cfg, evidence)
        cap, _ = _capacity(cfg)
        pressure = (f"; at --max-num-seqs {current} the running requests need up to {_n(round(current * per))} "
                    f"tokens, {current * per / cap:.0%} of capacity, so the scheduler preempts")
    why = f"{how}{pressure}"
    if current is None:
        why += f" (current value unknown: {cfg.source('max_num_seqs')})"
    return Fix(param, None if current is None else str(current), str(seqs), why)


# -- queue_blocking --------------------------------------------------------------------------------

@fix("queue_blocking")
@fix("queue_blocking.max_num_seqs")
def queue_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Raise --max-num-seqs when the KV cache has room for more sequences (else see queue_blocking.replicas)."""
    param, current = "--max-num-seqs", cfg.get("max_num_seqs")
    if current is None:
        return _missing(param, None, cfg, ["max_num_seqs"], "a higher --max-num-seqs")
    seqs, how, need = _seqs_that_fit(cfg, evidence)
    if seqs is None:
        return _missing(param, current, cfg, need, "whether the KV cache has room for more sequences")
    if seqs <= current:
        return None  # no KV headroom: more sequences would only be preempted; replicas are the fix
    waiting = _num(evidence, "waiting")
    target = min(seqs, 2 * current)  # at most double per change: watch TPOT before going further
    if waiting is not None:
        target = min(target, max(current + 1, current + math.ceil(waiting)))
    return Fix(param, str(current), str(target),
               f"requests wait while {current} sequences run; {how}, so there is KV room for more; "
               f"{'waiting ' + _n(waiting) + ', ' if waiting is not None else ''}"
               f"raised to {target} (at most double per change; watch TPOT)")


@fix("queue_blocking.replicas")
def queue_replicas(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Add replicas when the queue is longer than the KV cache can take in."""
    param = "replicas"
    replicas = _num(evidence, "replicas") or 1.0
    running, waiting = _num(evidence, "running"), _num(evidence, "waiting")
    current = cfg.get("max_num_seqs")
    seqs, how, _ = _seqs_that_fit(cfg, evidence)
    per_replica = min(x for x in (current, seqs) if x is not None) if (current or seqs) else None
    if per_replica is None or waiting is None:
        ev = [e for e, v in (("waiting", waiting),) if v is None]
        return _missing(param, int(replicas), cfg, [] if per_replica else ["max_num_seqs"],
                        "how many replicas the queue needs", ev)
    demand = (running if running is not None else per_replica * replicas) + waiting
    needed = max(int(replicas) + 1, math.ceil(demand / per_replica))
    if seqs is not None and current is not None and seqs > current:
        return None  # raising --max-num-seqs comes first (queue_blocking.max_num_seqs)
    return Fix(param, str(int(replicas)), str(needed),
               f"demand {_n(round(demand))} requests (running {_n(running or 0)} + waiting {_n(waiting)}) / "
               f"{per_replica} sequences per replica = {needed} replicas"
               + (f"; {how}" if how else ""))


# -- prefill_hol_blocking --------------------------------------------------------------------------

def _round_down(x: float, step: int) -> int:
    return max(step, int(x // step) * step)


@fix("prefill_hol_blocking")
@fix("prefill_hol_blocking.max_num_batched_tokens")
def prefill_max_num_batched_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-num-batched-tokens so one long prompt's chunk cannot fill a whole step."""
    param, current = "--max-num-batched-tokens", cfg.get("max_num_batched_tokens")
    if current is None:
        return _missing(param, None, cfg, ["max_num_batched_tokens"], "a smaller step budget")
    if cfg.get("enable_chunked_prefill") is False:
        return None  # without chunking the budget must hold a whole prompt: enable chunked prefill first
    floor = max(512, int(cfg.get("max_num_seqs", 0)))  # vLLM requires >= max_num_seqs
    suggested = max(floor, _round_down(current / 2, 256))
    if suggested >= current:
        return None
    p95 = _num(evidence, "iteration_tokens_p95")
    seen = f"step tokens p95 {_n(round(p95))} of the {_n(current)} budget: " if p95 is not None else ""
    return Fix(param, str(current), str(suggested),
               f"{seen}long prompts fill whole steps and stall decode of the running requests; half the budget "
               f"({_n(current)} / 2, multiple of 256, at least max(512, max_num_seqs {cfg.get('max_num_seqs', '?')}))"
               f" = {_n(suggested)} tokens per step bounds that stall")


@fix("prefill_hol_blocking.chunked_prefill")
def prefill_chunked(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Enable chunked prefill when it is off."""
    param, current = "--enable-chunked-prefill", cfg.get("enable_chunked_prefill")
    if current is None:
        return _missing(param, None, cfg, ["enable_chunked_prefill"], "whether chunked prefill is on")
    if current:
        return None
    return Fix(param, "false", "true",
               f"chunked prefill is off ({cfg.source('enable_chunked_prefill')}): each prompt is prefilled in one "
               f"step of up to {_n(cfg.get('max_num_batched_tokens', 0))} tokens while decode waits; chunking "
               "interleaves it with decode")


@fix("prefill_hol_blocking.long_prefill_token_threshold")
def prefill_long_threshold(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Cap one long prompt's share of a step with --long-prefill-token-threshold."""
    param, current = "--long-prefill-token-threshold", cfg.get("long_prefill_token_threshold")
    budget = cfg.get("max_num_batched_tokens")
    if budget is None:
        return _missing(param, current, cfg, ["max_num_batched_tokens"], "a threshold")
    bs = int(cfg.get("block_size", 16))
    suggested = _round_down(budget / 4, bs)
    if current and current <= suggested:
        return None
    return Fix(param, str(current if current is not None else 0), str(suggested),
               f"a long prompt may take the whole {_n(budget)}-token step ({'no cap' if not current else f'cap {current}'}); "
               f"a quarter of it ({_n(budget)} / 4, multiple of block size {bs}) = {_n(suggested)} leaves room for "
               "short prompts in every step")


# -- oom_risk ----------------------------------------------------------------------------------------

@fix("oom_risk")
@fix("oom_risk.gpu_memory_utilization")
def oom_gpu_memory_utilization(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --gpu-memory-utilization by the amount the peak exceeds a safe share of GPU memory."""
    param, current = "--gpu-memory-utilization", cfg.get("gpu_memory_utilization")
    used = _num(evidence, "gpu_memory_used_ratio")
    if current is None or used is None:
        return _missing(param, current, cfg, ["gpu_memory_utilization"], "a lower utilisation",
                        [] if used is not None else ["gpu_memory_used_ratio"])
    over = used - SAFE_GPU_MEMORY_RATIO
    if over <= 0:
        return None
    suggested = math.floor((current - over) * 100) / 100
    if suggested <= 0.1:
        return None
    why = (f"GPU memory peaked at {used:.1%} of total, {over:.1%} above the {SAFE_GPU_MEMORY_RATIO:.0%} safe line; "
           f"{current} - {over:.3f} = {suggested}")
    total = _num(evidence, "gpu_memory_total_bytes")
    bpt = cfg.get("kv_bytes_per_token")
    if total and bpt:
        why += f" (costs about {_n(int((current - suggested) * total / bpt))} KV tokens of capacity)"
    return Fix(param, str(current), f"{suggested:.2f}", why)


@fix("oom_risk.max_model_len")
def oom_max_model_len(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-model-len so max_num_seqs requests of that length fit the KV cache."""
    param, current = "--max-model-len", cfg.get("max_model_len")
    seqs = cfg.get("max_num_seqs")
    cap, cap_how = _capacity(cfg)
    if current is None or seqs is None or cap is None:
        return _missing(param, current, cfg, ["max_model_len", "max_num_seqs", "num_gpu_blocks", "block_size"],
                        "a max_model_len that fits")
    if current * seqs <= cap:
        return None
    bs = int(cfg.get("block_size", 16))
    suggested = (cap // seqs) // bs * bs
    p, g = _num(evidence, "mean_prompt_tokens"), _num(evidence, "mean_generation_tokens")
    if suggested < bs or (p is not None and g is not None and suggested < p + g):
        return None  # the traffic itself needs longer requests: lower max_num_seqs instead
    return Fix(param, str(current), str(suggested),
               f"--max-num-seqs {seqs} x max_model_len {_n(current)} = {_n(current * seqs)} tokens > KV capacity "
               f"{_n(cap)} ({cap_how}); {_n(cap)} / {seqs}, rounded down to the block size {bs} = {_n(suggested)}")


# -- kv_fragmentation --------------------------------------------------------------------------------

@fix("kv_fragmentation")
@fix("kv_fragmentation.block_size")
def fragmentation_block_size(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """A smaller --block-size when partly filled last blocks explain the unused KV slots."""
    param, bs = "--block-size", cfg.get("block_size")
    running, usage = _num(evidence, "running"), _num(evidence, "kv_usage")
    p, g = _num(evidence, "mean_prompt_tokens"), _num(evidence, "mean_generation_tokens")
    ev_missing = [n for n, v in (("running", running), ("kv_usage", usage), ("mean_prompt_tokens", p),
                                 ("mean_generation_tokens", g)) if v is None]
    if bs is None or not cfg.known("num_gpu_blocks") or ev_missing:
        return _missing(param, bs, cfg, ["block_size", "num_gpu_blocks"], "the block size", ev_missing)
    est = kvmath.fragmentation_estimate(running, p, g, usage * cfg.get("num_gpu_blocks"), bs)
    smallest = 32 if cfg.get("platform") == "cpu" else 16  # CPU prefers multiples of 32 (platforms/cpu.py:295)
    if bs <= smallest or est.wasted_slots <= 0:
        return None
    # expected use with the smaller block: the same tokens, last-block waste shrinks with the block
    new_waste = running * (smallest - 1) / 2
    new_util = est.tokens_held / (est.tokens_held + new_waste) if est.tokens_held else 1.0
    return Fix(param, str(bs), str(smallest),
               f"{_n(round(running))} running requests hold about {_n(round(est.tokens_held))} tokens "
               f"({_n(round(est.mean_tokens_per_running))} each: prompt {_n(round(p))} + half of {_n(round(g))} output) "
               f"in {_n(round(est.blocks_used))} blocks x {bs} = {_n(round(est.slots_held))} slots, "
               f"{est.utilisation:.0%} used; the partly filled last blocks alone waste ~{_n(round(est.expected_last_block_waste))} "
               f"slots, with block {smallest} ~{_n(round(new_waste))} ({new_util:.0%} of held slots used)")


# -- underbatched ------------------------------------------------------------------------------------

@fix("underbatched")
@fix("underbatched.max_num_batched_tokens")
def underbatched_batched_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Raise --max-num-batched-tokens when steps are capped by it while the device idles."""
    param, current = "--max-num-batched-tokens", cfg.get("max_num_batched_tokens")
    p95 = _num(evidence, "iteration_tokens_p95")
    if current is None or p95 is None:
        return _missing(param, current, cfg, ["max_num_batched_tokens"], "a larger step budget",
                        [] if p95 is not None else ["iteration_tokens_p95"])
    if p95 < 0.9 * current or current >= MAX_BATCHED_TOKENS:
        return None
    suggested = min(MAX_BATCHED_TOKENS, current * 2)
    return Fix(param, str(current), str(suggested),
               f"step tokens p95 {_n(round(p95))} reach the {_n(current)} budget while the device is under-used; "
               f"doubling it ({_n(current)} x 2, at most {_n(MAX_BATCHED_TOKENS)}) = {_n(suggested)} lets each step batch more")


@fix("underbatched.replicas")
def underbatched_replicas(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Fold traffic into fewer replicas when each runs far below its --max-num-seqs."""
    param = "replicas"
    replicas, running, seqs = _num(evidence, "replicas"), _num(evidence, "running"), cfg.get("max_num_seqs")
    if replicas is None or running is None or seqs is None:
        return _missing(param, replicas, cfg, ["max_num_seqs"], "a replica count",
                        [n for n, v in (("replicas", replicas), ("running", running)) if v is None])
    target = max(1, math.ceil(replicas * running / (0.7 * seqs)))
    if target >= replicas:
        return None
    return Fix(param, str(int(replicas)), str(target),
               f"each of {int(replicas)} replicas runs at most {_n(round(running))} of {seqs} sequences; "
               f"{int(replicas)} x {_n(round(running))} / (70% of {seqs}) = {target} replicas carry the same traffic")


# -- latency objectives ------------------------------------------------------------------------------

@fix("tpot_slo_breach")
@fix("tpot_slo_breach.max_num_seqs")
def tpot_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Lower --max-num-seqs so decode steps, which grow with the batch, meet the TPOT objective."""
    param, current = "--max-num-seqs", cfg.get("max_num_seqs")
    tpot, slo, running = (_num(evidence, n) for n in ("tpot_p95_seconds", "tpot_slo_seconds", "running"))
    ev_missing = [n for n, v in (("tpot_p95_seconds", tpot), ("tpot_slo_seconds", slo), ("running", running)) if v is None]
    if ev_missing or not tpot or not slo:
        return _missing(param, current, cfg, [], "a batch size that meets the objective", ev_missing or ["tpot_p95_seconds"])
    if tpot <= slo:
        return None
    batch = running if running and running > 0 else float(current or 1)
    suggested = max(1, math.floor(batch * slo / tpot))
    if current is not None and suggested >= current:
        return None
    return Fix(param, None if current is None else str(current), str(suggested),
               f"TPOT p95 {tpot * 1000:.0f} ms > objective {slo * 1000:.0f} ms at up to {_n(round(batch))} running; "
               f"decode step time grows about linearly with the batch: {_n(round(batch))} x {slo * 1000:.0f} / "
               f"{tpot * 1000:.0f} = {suggested} sequences")


@fix("ttft_slo_breach")
@fix("ttft_slo_breach.max_num_seqs")
def ttft_max_num_seqs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """When queueing makes most of TTFT, admit more sequences if the KV cache allows (as queue_blocking)."""
    ttft, queue = _num(evidence, "ttft_p95_seconds"), _num(evidence, "queue_time_p95_seconds")
    if ttft is None or queue is None:
        return _missing("--max-num-seqs", cfg.get("max_num_seqs"), cfg, [], "where TTFT goes",
                        [n for n, v in (("ttft_p95_seconds", ttft), ("queue_time_p95_seconds", queue)) if v is None])
    if queue < 0.5 * ttft:
        return None  # prefill, not queueing, dominates: see ttft_slo_breach.max_num_batched_tokens
    f = queue_max_num_seqs(cfg, evidence)
    if f is not None and f.concrete:
        f.why = f"queueing is {queue / ttft:.0%} of TTFT p95 ({queue:.2f} s of {ttft:.2f} s); " + f.why
    return f


@fix("ttft_slo_breach.max_num_batched_tokens")
def ttft_batched_tokens(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """When prefill dominates TTFT and a mean prompt needs several steps, raise the step budget to hold one."""
    param, current = "--max-num-batched-tokens", cfg.get("max_num_batched_tokens")
    prompt = _num(evidence, "mean_prompt_tokens")
    if current is None or prompt is None:
        return _missing(param, current, cfg, ["max_num_batched_tokens"], "a step budget",
                        [] if prompt is not None else ["mean_prompt_tokens"])
    if prompt <= current or current >= MAX_BATCHED_TOKENS:
        return None
    suggested = min(MAX_BATCHED_TOKENS, math.ceil(prompt / 1024) * 1024)
    steps = math.ceil(prompt / current)
    return Fix(param, str(current), str(suggested),
               f"a mean prompt of {_n(round(prompt))} tokens takes {steps} steps of {_n(current)}; "
               f"{_n(suggested)} (the prompt rounded up to 1024, at most {_n(MAX_BATCHED_TOKENS)}) prefills it in one")


# -- engine_stall ----------------------------------------------------------------------------------

# vLLM 0.32 envs.py: VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, how long the multiprocess executor waits for
# one model step before it fails the engine (v1/executor/multiproc_executor.py uses it)
EXECUTE_MODEL_TIMEOUT_DEFAULT_S = 300
STALL_TIMEOUT_FLOOR_S = 60


@fix("engine_stall")
def stall_execute_timeout(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
    """Shorten vLLM's step timeout so a hung step fails (and gets restarted) instead of hanging for minutes."""
    param = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
    current = cfg.get("execute_model_timeout_s", EXECUTE_MODEL_TIMEOUT_DEFAULT_S)
    itl = _num(evidence, "itl_p99_seconds")
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


# -- the incidents hook --------------------------------------------------------------------------------

def _register_with_incidents() -> None:
    """Expose every fix through agent/diagnosis/incidents.py's hook: fn(config, evidence, labels) -> dict | None."""
    try:
        from vllm_sentinel.agent.diagnosis.incidents import register_fix
    except ImportError:  # incidents not present: FIXES still works on its own
        return

    def adapter(fn: FixFn) -> Callable[[Mapping[str, Any], Mapping[str, float | None], Mapping[str, str]], dict | None]:
        def run(config: Mapping[str, Any], evidence: Mapping[str, float | None], labels: Mapping[str, str]) -> dict | None:
            result = fn(as_live_config(config, labels.get("instance", "")), evidence)
            return None if result is None else result.as_dict()
        run.__doc__ = fn.__doc__
        return run

    for name, fn in FIXES.items():
        register_fix(name)(adapter(fn))


_register_with_incidents()
