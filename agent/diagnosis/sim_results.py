"""What a simulated vLLM engine served (sim_scheduler's output): per request timings, per token latencies, totals.

Quantiles are the smallest observation with at least q of the observations at or below it (the
inverted CDF), the same for per-request signals and for the inter-token latencies held as
(value, count) pairs, so a p95 is always a latency that was actually observed.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SIGNALS = ("ttft", "itl", "tpot", "queue", "e2e")


@dataclass
class SimResult:
    """Per request timings (NaN where a request never got that far), inter-token latencies and engine totals."""

    arrival_s: np.ndarray  # when it reached the server; NaN: a closed loop never sent it
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    queue_s: np.ndarray  # arrival -> first scheduled, as request_queue_time_seconds
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    preemptions: np.ndarray
    finished: np.ndarray
    rejected: np.ndarray  # too long for max_model_len or for the whole KV cache: never queued
    itl_values: np.ndarray  # every inter-token latency as (value, count) pairs: count tokens waited value
    itl_counts: np.ndarray
    total_preemptions: int
    steps: int
    tokens_per_step: dict[int, int]  # tokens in a step (iteration_tokens_total) -> how many steps
    span_s: float
    busy_s: float
    peak_blocks: int  # the most KV blocks held at once (the null block not counted)
    arrived: int  # requests that arrived within the span, rejected ones included
    generated_tokens: int
    prompt_tokens_served: int  # prompts of the requests that got their first token
    recomputed_tokens: int = 0  # prompt and output tokens computed again after preemptions
    mix: "StepMix | None" = None  # what the steps held, for the step-time fit (sim_calibrate)

    @property
    def num_rejected(self) -> int:
        """Requests refused outright."""
        return int(self.rejected.sum())

    @property
    def tpot_s(self) -> np.ndarray:
        """Per request mean inter-token latency, (e2e - ttft) / (output_tokens - 1); NaN for one-token outputs."""
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)
        return np.where(self.output_tokens > 1, tpot, np.nan)

    def quantile(self, signal: str, q: float) -> float | None:
        """The q-quantile of ttft, itl (per token), tpot (per request), queue or e2e; None without observations."""
        if signal not in SIGNALS:
            raise ValueError(f"unknown signal {signal!r}: use one of {', '.join(SIGNALS)}")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is outside [0, 1]: pass a fraction such as 0.95")
        if signal == "itl":
            return weighted_quantile(self.itl_values, self.itl_counts, q)
        values = self._per_request(signal)
        values = values[~np.isnan(values)]
        return weighted_quantile(values, np.ones(len(values), dtype=np.int64), q)

    def throughput(self) -> dict[str, float]:
        """Finished requests, generated tokens and prompt tokens per second over the span."""
        span = self.span_s
        if span <= 0:
            return {"requests_per_s": 0.0, "generated_tokens_per_s": 0.0, "prompt_tokens_per_s": 0.0}
        return {"requests_per_s": int(self.finished.sum()) / span,
                "generated_tokens_per_s": self.generated_tokens / span,
                "prompt_tokens_per_s": self.prompt_tokens_served / span}

    def preemptions_per_s(self) -> float:
        """Preemptions per second over the span."""
        return self.total_preemptions / self.span_s if self.span_s > 0 else 0.0

    def goodput(self, ttft_slo_s: float | None, itl_slo_s: float | None, e2e_slo_s: float | None = None) -> float:
        """Finished requests per second meeting every objective given (None = no objective).

        Kept simple: a request counts when its TTFT <= ttft_slo_s, its mean inter-token latency (tpot)
        <= itl_slo_s (one-token outputs pass) and its e2e <= e2e_slo_s; no per-request ITL percentile.
        """
        return int(self._meeting(ttft_slo_s, itl_slo_s, e2e_slo_s).sum()) / self.span_s if self.span_s > 0 else 0.0

    def attainment(self, ttft_slo_s: float | None, itl_slo_s: float | None, e2e_slo_s: float | None = None) -> float:
        """The requests meeting every objective as a fraction of those that arrived (unfinished or rejected: missed)."""
        return int(self._meeting(ttft_slo_s, itl_slo_s, e2e_slo_s).sum()) / self.arrived if self.arrived else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: p50/p95 of each signal, preemptions, throughput and engine totals."""
        out: dict[str, Any] = {
            "requests": len(self.arrival_s), "finished": int(self.finished.sum()), "rejected": self.num_rejected,
            "span_s": _r(self.span_s), "busy_s": _r(self.busy_s), "steps": self.steps,
            "preemptions": self.total_preemptions, "preemptions_per_s": _r(self.preemptions_per_s()),
            "peak_blocks": self.peak_blocks,
            "throughput": {k: _r(v) for k, v in self.throughput().items()},
        }
        for signal in SIGNALS:
            out[f"{signal}_s"] = {"p50": _r(self.quantile(signal, 0.5)), "p95": _r(self.quantile(signal, 0.95))}
        return out

    def _per_request(self, signal: str) -> np.ndarray:
        if signal == "tpot":
            return self.tpot_s
        return {"ttft": self.ttft_s, "queue": self.queue_s, "e2e": self.e2e_s}[signal]

    def _meeting(self, ttft_slo_s: float | None, itl_slo_s: float | None, e2e_slo_s: float | None) -> np.ndarray:
        ok = self.finished.copy()
        # NaN compares False, so a missing value misses the objective; one-token outputs have no tpot to miss
        if ttft_slo_s is not None:
            ok &= self.ttft_s <= ttft_slo_s
        if itl_slo_s is not None:
            ok &= (self.output_tokens <= 1) | (self.tpot_s <= itl_slo_s)
        if e2e_slo_s is not None:
            ok &= self.e2e_s <= e2e_slo_s
        return ok


class SimTally:
    """What the engine records while it runs: per request moments, step totals and inter-token latencies."""

    def __init__(self, n: int) -> None:
        self.arrival_s = np.full(n, np.nan)  # when each request reached the server (a closed loop sends late)
        self.queue_at, self.first_token_at, self.finished_at = (np.full(n, np.nan) for _ in range(3))
        self.queue_tick, self.first_token_tick = np.full(n, np.nan), np.full(n, np.nan)  # the steps of both
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.rejected = np.zeros(n, dtype=bool)
        self.steps = self.total_preemptions = self.generated = self.prompt_served = self.peak_blocks = 0
        self.recomputed = 0  # tokens computed again after a preemption (vLLM counts them in no metric)
        self.busy_s = 0.0
        self.tokens_per_step: dict[int, int] = {}
        # runs of steps: (the first step's latency, its growth per step, steps, tokens per step)
        self._runs = (array("d"), array("d"), array("q"), array("q"))
        self._single = array("d")
        # runs of steps alike in what they held: (first step's index, steps, decoding sequences, prefill tokens)
        self._mix = (array("q"), array("q"), array("q"), array("q"))

    def stepped(self, seconds: float, tokens: int, steps: int = 1) -> None:
        """`steps` engine steps of `tokens` tokens each took `seconds` in all."""
        self.steps += steps
        self.busy_s += seconds
        self.tokens_per_step[tokens] = self.tokens_per_step.get(tokens, 0) + steps

    def held(self, first_tick: int, steps: int, decodes: int, prefill: int) -> None:
        """`steps` steps from step `first_tick` on each held `decodes` decoding sequences and `prefill` prompt tokens."""
        for column, v in zip(self._mix, (first_tick, steps, decodes, prefill)):
            column.append(v)

    def latency_run(self, first_s: float, growth_s: float, steps: int, tokens: int) -> None:
        """`tokens` tokens a step for `steps` steps, waiting first_s, first_s + growth_s, ... after the previous ones."""
        for column, v in zip(self._runs, (first_s, growth_s, steps, tokens)):
            column.append(v)
        self.generated += steps * tokens

    def token(self, latency_s: float) -> None:
        """One token that came latency_s after its request's previous one."""
        self._single.append(latency_s)
        self.generated += 1

    def result(self, requests: Sequence[Any], span_s: float, horizon_s: float) -> SimResult:
        """The tallies as a SimResult; requests are the SimRequests (their prompt_tokens and output_tokens)."""
        arrival = self.arrival_s
        first, growth, steps, tokens = (np.array(c) for c in self._runs)
        offsets = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
        values = np.repeat(first, steps) + np.repeat(growth, steps) * offsets
        return SimResult(
            arrival_s=arrival, prompt_tokens=np.array([r.prompt_tokens for r in requests], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in requests], dtype=np.int64),
            queue_s=self.queue_at - arrival, ttft_s=self.first_token_at - arrival, e2e_s=self.finished_at - arrival,
            preemptions=self.preemptions, finished=~np.isnan(self.finished_at), rejected=self.rejected,
            itl_values=np.concatenate([values, np.array(self._single, dtype=float)]),
            itl_counts=np.concatenate([np.repeat(tokens, steps), np.ones(len(self._single), dtype=np.int64)]),
            total_preemptions=self.total_preemptions, steps=self.steps, tokens_per_step=dict(self.tokens_per_step),
            span_s=span_s, busy_s=self.busy_s, peak_blocks=self.peak_blocks,
            arrived=int((arrival < horizon_s).sum()), generated_tokens=self.generated,
            prompt_tokens_served=self.prompt_served, recomputed_tokens=self.recomputed,
            mix=step_mix(self._mix, self.queue_tick, self.first_token_tick))


@dataclass(frozen=True)
class StepMix:
    """What a replay's prefills met, from first scheduled to first token: the steps they spanned and the tokens
    those steps held in all (their own prompt, other prompts, recomputation, decoding sequences), on average."""

    span_steps: float
    span_tokens: float


def step_mix(runs: tuple, start_tick: np.ndarray, end_tick: np.ndarray) -> StepMix | None:
    """The StepMix of runs of steps (first step, steps, decoding sequences, prefill tokens) and each request's
    first scheduled and first token steps; None without steps or prefills."""
    first, steps, decodes, prefill = (np.array(c, dtype=float) for c in runs)
    done = ~np.isnan(start_tick) & ~np.isnan(end_tick)
    if not steps.sum() or not done.any():
        return None
    order = np.argsort(first, kind="stable")
    first, steps, per = first[order], steps[order], (decodes + prefill)[order]
    cum = np.concatenate([[0.0], np.cumsum(steps * per)])

    def before(ticks: np.ndarray) -> np.ndarray:
        # the tokens of every step before `tick`: whole runs before it, and the part of the run it falls in
        i = np.clip(np.searchsorted(first, ticks, side="right") - 1, 0, len(first) - 1)
        return cum[i] + np.clip(ticks - first[i], 0, steps[i]) * per[i]

    a, b = start_tick[done], end_tick[done]
    return StepMix(span_steps=float((b - a).mean()), span_tokens=float((before(b) - before(a)).mean()))


def weighted_quantile(values: np.ndarray, counts: np.ndarray, q: float) -> float | None:
    """The smallest value with at least q of the total count at or below it; None when the count is 0."""
    total = int(counts.sum())
    if total == 0:
        return None
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(counts[order])
    # rounded so 0.07 * 100 (7.000000000000001 in binary floating point) is rank 7, not 8
    rank = max(1, math.ceil(round(q * total, 9)))
    return float(values[order][np.searchsorted(cumulative, rank, side="left")])


def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)
