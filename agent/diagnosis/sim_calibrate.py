"""The what-if model calibrated on a window: a step-time model fitted from the server's own history, then the
window replayed with the configuration that ran and judged against what the server measured.

Step time. A step of `t` tokens takes `base + per_token * t`. Two figures of the window pin both:
the mean step, from bins where requests waited throughout (the engine never idled: the bin's seconds
over its steps, at that bin's tokens per step), and the mean prefill time (scheduled to first token)
of a mean prompt, which adds the prompt's tokens to such a step. Where no bin was saturated the mean
inter-token latency stands for the mean step.

Judgement. The replay's p95 TTFT and inter-token latency are read through vLLM's own bucket bounds,
as histogram_quantile reads the server's, and compared with the server's, as are preemptions and
throughput. Over CALIBRATION_BOUND on any of them, the model's predictions are withheld, except a
latency p95 inside the measured p90..p99 band (see `judge`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from vllm_sentinel.agent.diagnosis.sim_results import SimResult, StepMix
from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig, SimRequest, StepTime, simulate
from vllm_sentinel.agent.diagnosis.sim_workload import Measured, Workload
from vllm_sentinel.agent.promql.functions import bucket_quantile

CALIBRATION_BOUND = 0.30
# below these the measured figure is noise: a difference under the floor counts as no error
ERROR_FLOORS = {"ttft_p95_s": 0.05, "itl_p95_s": 0.005, "preemptions_per_s": 0.1, "generation_tokens_per_s": 1.0,
                "requests_per_s": 0.05}
JUDGED = ("ttft_p95_s", "itl_p95_s", "preemptions_per_s", "generation_tokens_per_s")
LATENCY_FAMILIES = {"ttft_p95_s": "ttft", "itl_p95_s": "itl"}  # p95s read through vLLM's buckets
BAND = (0.90, 0.99)  # a modelled p95 between these measured quantiles matches (see judge)
SATURATED_WAITING = 0.5  # a bin whose mean waiting count is at least this kept the engine busy throughout
REFIT_MOVES = 0.02  # the step time's refit changes a cost by more than this share: replay again
# On vLLM's CPU backend the worker busy-waits: with requests running it holds a core (0.85-0.98 a bin measured on
# this project's 2-core hosts, the sidecar's reports and Prometheus beside it). Under this, something else had its
# core (another process, a VM's steal time) and the window's step times are the contention's, not the server's.
CONTENDED_BELOW = 0.70

# EngineConfig field -> the live configuration's name (vLLM's)
CONFIG_NAMES = {"max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                "num_blocks": "num_gpu_blocks", "block_size": "block_size", "max_model_len": "max_model_len"}


class Unrepresentable(Exception):
    """The configuration lacks a value the model needs, or holds one it cannot represent."""


@dataclass
class Calibration:
    """The fitted step time, the replay of the window beside what was measured, and whether to trust it."""

    step_time: StepTime
    fitted_from: str
    measured: dict[str, float | None]
    modelled: dict[str, float | None]
    error: dict[str, float | None]
    withheld: str | None = None
    notes: list[str] = field(default_factory=list)
    worker_busy: float | None = None  # cores the CPU backend's worker ran while requests ran (None: not read)
    mean_step_s: float | None = None  # the window's mean step the fit was pinned to, and its tokens (recomputed
    tokens_per_step: float | None = None  # ones counted): what step_speed sets another window's model against

    def as_dict(self) -> dict[str, Any]:
        """The calibration block of the whatif document."""
        st = self.step_time
        return {"step_time": {"base_s": _r(st.base_s), "per_token_s": _r(st.per_prefill_token_s),
                              "fitted_from": self.fitted_from},
                "measured": {k: _r(v) for k, v in self.measured.items()},
                "modelled": {k: _r(v) for k, v in self.modelled.items()},
                "error": {k: _r(v) for k, v in self.error.items()}, "bound": CALIBRATION_BOUND,
                "withheld": self.withheld, "notes": self.notes, "worker_busy": _r(self.worker_busy),
                "mean_step_s": _r(self.mean_step_s), "tokens_per_step": _r(self.tokens_per_step)}


def engine_config(cfg: Mapping[str, Any]) -> EngineConfig:
    """The scheduler's configuration from a live configuration's values; Unrepresentable names what is missing."""
    missing = [name for name in CONFIG_NAMES.values() if cfg.get(name) is None]
    if missing:
        raise Unrepresentable(f"the configuration lacks {', '.join(missing)}: the model needs each (a sidecar "
                              "beside the server records them; give them with --set NAME=VALUE)")
    policy = str(cfg.get("scheduling_policy") or "fcfs")
    try:
        return EngineConfig(**{k: int(cfg[v]) for k, v in CONFIG_NAMES.items()},
                            chunked_prefill=bool(cfg.get("enable_chunked_prefill", True)),
                            long_prefill_token_threshold=int(cfg.get("long_prefill_token_threshold") or 0),
                            policy=policy)
    except (TypeError, ValueError) as e:
        raise Unrepresentable(f"the configuration cannot be modelled: {e}") from None


def fit_step_time(workload: Workload, recompute_per_preemption: float = 0.0,
                  mix: StepMix | None = None) -> tuple[StepTime, str]:
    """base and per-token seconds of a step from the window (see the module's docstring), and how.

    vLLM's iteration token counts leave out what a preempted request computes again (its prompt and the
    output it had), so `recompute_per_preemption` tokens are added per measured preemption. A prefill is
    first read as one step holding its prompt beside a mean step's tokens; a replay's StepMix says what its
    prefills met (other prompts, recomputation, decoding sequences)."""
    mean_step, tokens_per_step, how = _mean_step(workload, recompute_per_preemption)
    prefill = workload.measured.tally.increases
    prompt = workload.prompt.mean * (1 - workload.prefix_hit_rate)
    per_token = 0.0
    if prefill.get("prefill_count") and prompt >= 1:
        mean_prefill = prefill["prefill_sum"] / prefill["prefill_count"]
        # a prefill of k steps holding T tokens in all takes k * base + per_token * T; a step base + per_token * t
        steps_spanned, tokens_met = (mix.span_steps, mix.span_tokens) if mix else (1.0, tokens_per_step + prompt)
        extra = tokens_met - steps_spanned * tokens_per_step
        per_token = max(0.0, (mean_prefill - steps_spanned * mean_step) / extra) if extra > 0 else 0.0
        how += f", the mean prefill time {mean_prefill * 1000:.1f} ms of {prompt:.0f}-token prompts"
        if mix:
            how += f" over {steps_spanned:.2g} steps of {tokens_met / steps_spanned:.0f} tokens in the replay"
    base = max(mean_step - per_token * tokens_per_step, 0.0)
    if base == 0.0 and tokens_per_step > 0:  # the prefill figure overshot: all of the step is per token
        per_token = mean_step / tokens_per_step
    return StepTime(base, per_token, per_token), how


def _mean_step(workload: Workload, recompute_per_preemption: float) -> tuple[float, float, str]:
    """The mean step's seconds and tokens (recomputation counted), and from what."""
    inc = workload.measured.tally.increases
    saturated = [b for b in workload.bins if b.gauge_seconds.get("waiting", 0.0) / b.seconds >= SATURATED_WAITING
                 and b.increases.get("steps", 0.0) > 0]
    steps = sum(b.increases["steps"] for b in saturated)
    if steps > 0:
        recomputed = recompute_per_preemption * sum(b.increases.get("preemptions", 0.0) for b in saturated)
        how = f"{len(saturated)} saturated bins ({steps:.0f} steps)"
        if recomputed:
            how += f", {recomputed / steps:.2g} recomputed tokens a step"
        return (sum(b.seconds for b in saturated) / steps,
                (sum(b.increases.get("step_tokens", 0.0) for b in saturated) + recomputed) / steps, how)
    if inc.get("itl_count"):
        running = workload.measured.tally.gauge_seconds.get("running", 0.0) / workload.measured.seconds
        return inc["itl_sum"] / inc["itl_count"], max(1.0, running), "the mean inter-token latency (no saturated bin)"
    raise Unrepresentable("the window has no engine steps (vllm:iteration_tokens_total) and no inter-token "
                          "latencies: nothing to time a step by")


def replica_groups(workload: Workload, rate_factor: float = 1.0, replicas: int = 1) -> list[tuple[int | None, int]]:
    """(clients of one replica, replicas like it): a closed loop's clients dealt over the replicas (12 over 5: two
    of 3, three of 2; replicas left without a client are idle and not listed); an open loop's one share."""
    if workload.clients is None:
        return [(None, replicas)]
    each, extra = divmod(max(1, round(workload.clients * rate_factor)), replicas)
    return [(c, n) for c, n in ((each + 1, extra), (each, replicas - extra)) if c > 0 and n > 0]


def run_model(workload: Workload, config: EngineConfig, step_time: StepTime, seed: int = 0,
              rate_factor: float = 1.0, replicas: int = 1, clients: int | None = None) -> SimResult:
    """One replica's share of the window's workload (rate scaled, split over replicas) through the model; `clients`:
    that replica's share of a closed loop (see replica_groups; default the whole loop over the replicas, rounded up)."""
    if workload.clients is not None:
        clients = clients or max(1, math.ceil(workload.clients * rate_factor / replicas))
        requests = workload.requests(seed, rate_factor)
    else:
        clients = None
        requests = workload.requests(seed, rate_factor / replicas)
    # the server accepted every request it served: a length drawn past max_model_len from a wide bucket is cut
    requests = [r if r.prompt_tokens + r.output_tokens <= config.max_model_len else
                fit_length(r, config.max_model_len) for r in requests]
    return simulate(requests, config, step_time, horizon_s=workload.seconds, clients=clients)


def fit_length(r: SimRequest, max_model_len: int) -> SimRequest:
    """The request cut to max_model_len: the prompt first, down to one token, then the output."""
    output = min(r.output_tokens, max_model_len - 1)
    prompt = max(1, max_model_len - output)
    return replace(r, prompt_tokens=prompt, output_tokens=output, cached_tokens=min(r.cached_tokens, prompt - 1))


def observed_like(result: SimResult, workload: Workload) -> dict[str, float | None]:
    """The replay's headline figures as the server's metrics would show them (quantiles through its buckets)."""
    measured = workload.measured
    itl = _bucketed(result.itl_values, result.itl_counts, measured.bounds("itl"), 0.95)
    ttft = result.ttft_s[~np.isnan(result.ttft_s)]
    return {"ttft_p95_s": _bucketed(ttft, np.ones(len(ttft)), measured.bounds("ttft"), 0.95),
            "itl_p95_s": itl, "preemptions_per_s": result.preemptions_per_s(),
            "generation_tokens_per_s": result.throughput()["generated_tokens_per_s"],
            "requests_per_s": result.throughput()["requests_per_s"]}


def calibrate(workload: Workload, config: EngineConfig, seed: int = 0, busy_wait: bool = False) -> Calibration:
    """Replay the window with the configuration that ran; its error against the measurement; withheld over the bound,
    or (busy_wait: a CPU backend's worker) where the worker did not get its core."""
    step_time, how = fit_step_time(workload)
    replay = run_model(workload, config, step_time, seed)
    # the window's recomputation, sized by the replay, is work its steps did that no counter shows; and the
    # steps a prefill shares (other prompts, recomputation, decodes) are the replay's, not one prompt's alone
    recompute = replay.recomputed_tokens / replay.total_preemptions \
        if replay.total_preemptions and workload.measured.rate("preemptions") > 0 else 0.0
    mean_step, tokens_per_step, _how = _mean_step(workload, recompute)
    if recompute or replay.mix:
        refit, how = fit_step_time(workload, recompute, replay.mix)
        # a light load's prefills run alone and nothing is recomputed: the refit moves nothing worth a replay
        moved = max(abs(refit.base_s - step_time.base_s) / step_time.base_s,
                    abs(refit.per_prefill_token_s - step_time.per_prefill_token_s)
                    / max(step_time.per_prefill_token_s, 1e-9))
        step_time = refit
        if recompute or moved > REFIT_MOVES:
            replay = run_model(workload, config, step_time, seed)
    measured = {k: v for k, v in workload.measured.as_dict().items() if k in JUDGED + ("requests_per_s",)}
    measured["itl_p95_s"] = workload.measured.quantile("itl", 0.95)
    modelled = observed_like(replay, workload)
    error = {k: relative_error(modelled.get(k), measured.get(k), ERROR_FLOORS[k]) for k in JUDGED}
    over, notes = judge(error, modelled, workload.measured)
    withheld = None
    if over:
        worst = ", ".join(f"{k} {'not comparable' if e is None else f'off by {e:.0%}'} (measured "
                          f"{_fmt(measured.get(k))}, modelled {_fmt(modelled.get(k))})" for k, e in over)
        withheld = (f"the model's replay of the window misses what the server measured: {worst}; over the "
                    f"{CALIBRATION_BOUND:.0%} bound, its predictions are not shown")
    busy = workload.worker_busy() if busy_wait else None
    if busy is not None:
        notes.append(f"vLLM's worker ran {busy:.0%} of a core while requests were running (alone it busy-waits "
                     "on one)")
        if lost_its_core(busy) and withheld is None:
            withheld = contended(busy, "the window") + "; its predictions are not shown"
    return Calibration(step_time, how, measured, modelled, error, withheld, notes, busy, mean_step, tokens_per_step)


def lost_its_core(busy: float | None) -> bool:
    """A CPU-backend worker read under CONTENDED_BELOW cores (None: not read, so not known to be contended)."""
    return busy is not None and busy < CONTENDED_BELOW


def contended(busy: float, window: str) -> str:
    """Why a window whose busy-waiting worker ran `busy` cores cannot stand for the server's speed."""
    return (f"vLLM's worker ran {busy:.0%} of a core in {window} while requests were running, under "
            f"{CONTENDED_BELOW:.0%}: on the CPU backend it busy-waits on a core of its own, so something else on "
            "the host took it (another process, the sidecar's reports, a VM's steal time) and the window's step "
            "times are that contention's, not the server's; pick a window the host left to vLLM")


def judge(error: Mapping[str, float | None], modelled: Mapping[str, float | None],
          measured: Measured) -> tuple[list[tuple[str, float | None]], list[str]]:
    """The judged figures over the bound, and a note for each latency p95 let through by its band.

    A latency p95 read through vLLM's buckets is known only to its bucket: around a 2 s TTFT objective
    the bounds are 1, 2.5 and 5 s, and a server whose p95 moves from just under 2.5 s to just over
    reads 2.42 or 3.59 (the same configuration, two runs); 91 % of requests under 1 s and 9 % in the
    next bucket read as a p95 of 1.68 s, however close to 1 s those 9 % were. So a modelled p95 passes
    whatever its relative error where the buckets cannot tell it from the measured p90..p99 (BAND):
    between the bounds around it, the measured share of requests spans part of that band."""
    over, notes = [], []
    for key, e in error.items():
        if e is not None and e <= CALIBRATION_BOUND:
            continue
        family, value = LATENCY_FAMILIES.get(key), modelled.get(key)
        shares = _shares_around(measured, family, value) if family and e is not None and value is not None else None
        if shares is not None and shares[2] <= BAND[1] and shares[3] >= BAND[0]:
            lo, hi, below, at = shares
            notes.append(f"{key}: modelled {_fmt(value)} is {e:.0%} off the measured p95 as interpolated, but "
                         f"between vLLM's bounds {_fmt(lo)} and {_fmt(hi)} s, where the measured share of requests "
                         f"goes from {below:.0%} to {at:.0%}, it may be anywhere from the measured p"
                         f"{BAND[0] * 100:.0f} to p{BAND[1] * 100:.0f}: as close as the buckets tell")
            continue
        over.append((key, e))
    return over, notes


def _shares_around(measured: Measured, family: str, value: float) -> tuple[float, float, float, float] | None:
    """(lower bound, upper bound, measured share at or under each) of the bucket holding `value`; None without
    buckets or observations."""
    by_le = measured.tally.buckets.get(family) or {}
    total = by_le.get(math.inf, 0.0)
    if total <= 0:
        return None
    bounds = sorted(by_le)
    hi = next(b for b in bounds if b >= value)  # +Inf at the latest
    lo = max((b for b in bounds if b < value), default=0.0)
    return lo, hi, (by_le[lo] / total if lo in by_le else 0.0), by_le[hi] / total


def relative_error(modelled: float | None, measured: float | None, floor: float) -> float | None:
    """|modelled - measured| / measured; differences under `floor` count as 0; None where either is missing."""
    if modelled is None or measured is None or not (math.isfinite(modelled) and math.isfinite(measured)):
        return None
    if abs(modelled - measured) <= floor:
        return 0.0
    return abs(modelled - measured) / max(abs(measured), floor)


def _bucketed(values: np.ndarray, counts: np.ndarray, bounds: list[float], q: float) -> float | None:
    """The q-quantile of weighted values as histogram_quantile reads them from buckets with these bounds."""
    if not bounds or len(values) == 0:
        return None
    edges = np.array(bounds, dtype=float)
    per_bucket = np.bincount(np.searchsorted(edges, values, side="left"), weights=counts, minlength=len(edges) + 1)
    cumulative = np.cumsum(per_bucket[:len(edges)])
    v = bucket_quantile(q, edges, cumulative)
    return None if math.isnan(v) else float(v)


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:.3g}"


def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)
