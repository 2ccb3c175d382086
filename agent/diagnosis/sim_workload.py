"""The workload a window of history served, read from vLLM's counters and histograms, for the what-if model.

Everything comes from increases over time bins (never a sampled gauge moment, except the running and
waiting means): how requests arrived, how long their prompts and outputs were, how much of the
prompts the prefix cache served, and what the server measured (latency histograms, preemptions,
throughput), which the model's replay of the same window is judged against.

Arrivals: when requests waited throughout and the number in the server did not grow, the load was
a closed loop (N clients, each sending its next request when the last one returned: a benchmark, a
batch job, a saturated router) and it is replayed as N clients, N from Little's law; otherwise
requests arrived on their own, as many per bin as completed plus the growth of the population.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from vllm_sentinel.agent.diagnosis.capacity_bins import Bin, Families, Tally, merged, read_bins, read_span
from vllm_sentinel.agent.diagnosis.sim_scheduler import SimRequest

GENERATION_HANDLERS = "/v1/completions|/v1/chat/completions|/v1/responses"
FAMILIES = Families(
    counters={"requests": "vllm:request_success_total", "prompt_tokens": "vllm:prompt_tokens_total",
              "generation_tokens": "vllm:generation_tokens_total", "preemptions": "vllm:num_preemptions_total",
              "steps": "vllm:iteration_tokens_total_count", "step_tokens": "vllm:iteration_tokens_total_sum",
              "itl_sum": "vllm:inter_token_latency_seconds_sum", "itl_count": "vllm:inter_token_latency_seconds_count",
              "prompt_sum": "vllm:request_prompt_tokens_sum", "prompt_count": "vllm:request_prompt_tokens_count",
              "output_sum": "vllm:request_generation_tokens_sum",
              "output_count": "vllm:request_generation_tokens_count",
              "e2e_sum": "vllm:e2e_request_latency_seconds_sum", "e2e_count": "vllm:e2e_request_latency_seconds_count",
              "prefill_sum": "vllm:request_prefill_time_seconds_sum",
              "prefill_count": "vllm:request_prefill_time_seconds_count",
              "prefix_hits": "vllm:prefix_cache_hits_total", "prefix_queries": "vllm:prefix_cache_queries_total",
              # the API server's own timing of generation requests: past vLLM's e2e, time spent in its frontend
              "http_sum": f"http_request_duration_seconds_sum{{handler=~\"{GENERATION_HANDLERS}\"}}",
              "http_count": f"http_request_duration_seconds_count{{handler=~\"{GENERATION_HANDLERS}\"}}",
              # the sidecar's reading of the process that runs the model (see Workload.worker_busy)
              "worker_cpu": 'vllm_sentinel_process_cpu_seconds_total{role="worker"}'},
    gauges={"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"},
    histograms={"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds",
                "queue": "vllm:request_queue_time_seconds", "e2e": "vllm:e2e_request_latency_seconds",
                "prompt": "vllm:request_prompt_tokens", "output": "vllm:request_generation_tokens"})

# a closed loop: requests waited in this share of the bins or more, and the population grew by less than this
SATURATED_SHARE = 0.8
POPULATION_GROWTH = 1.0
MIN_REQUESTS = 20  # fewer completed requests in a window say too little about its workload to model it
BUSY_RUNNING = 1.0  # a bin with at least this many requests running on average kept the worker stepping
MIN_BUSY_BINS = 2


class NotEnoughTraffic(Exception):
    """The window holds too few completed requests (or none of the families the model reads)."""


@dataclass(frozen=True)
class LengthDist:
    """Token lengths as a histogram of vLLM's buckets and their exact mean (its _sum over its _count)."""

    bounds: tuple[float, ...]  # upper bounds, ascending, +Inf last
    counts: tuple[float, ...]  # observations per bucket (not cumulative)
    mean: float

    @classmethod
    def from_buckets(cls, cumulative: dict[float, float], mean: float) -> "LengthDist":
        """From summed cumulative buckets: {100: 3, 200: 10, inf: 10} -> counts (3, 7, 0)."""
        bounds = sorted(cumulative)
        cum = np.maximum.accumulate([max(0.0, cumulative[b]) for b in bounds])
        counts = np.diff(np.concatenate([[0.0], cum]))
        return cls(tuple(bounds), tuple(float(c) for c in counts), float(mean))

    def sample(self, n: int, rng: random.Random) -> list[int]:
        """n lengths: a bucket drawn by its share, then a place in it, so the sample's mean is the measured mean.

        One bucket and a whole-number mean: every request had that length (a benchmark's fixed lengths).
        Otherwise each bucket holds the least-assuming shape with the right mean, a truncated exponential
        with one rate (per bucket width) for all buckets: 200-word prompts averaging 203.9 tokens sit
        just above 200 in vLLM's (200, 500] bucket, not spread over it. The spread matters: on the real
        scheduler, 12 clients of identical 204+200-token requests on 7 blocks preempt 0.58 times a request,
        the same with prompts 200-212 long 0.97 times, as the server measured (0.99)."""
        total = sum(self.counts)
        if n <= 0 or total <= 0:
            return []
        used = [i for i, c in enumerate(self.counts) if c > 0]
        if len(used) == 1 and abs(self.mean - round(self.mean)) < WHOLE_MEAN:
            return [max(1, round(self.mean))] * n
        lows = [0.0] + list(self.bounds[:-1])
        picks = rng.choices(range(len(self.counts)), weights=self.counts, k=n)
        edges = np.array([(lows[i], self._top(i, lows)) for i in picks], dtype=float)
        spots = np.array([rng.random() for _ in range(n)])
        return [int(v) for v in _lengths(edges, spots, self._fit_rate(edges, spots))]

    def _top(self, i: int, lows: list[float]) -> float:
        # the +Inf bucket is read as reaching twice its lower bound (its mean is fitted within it anyway)
        return self.bounds[i] if math.isfinite(self.bounds[i]) else max(2 * lows[i], lows[i] + 1)

    def _fit_rate(self, edges: np.ndarray, spots: np.ndarray) -> float:
        def mean_at(rate: float) -> float:
            return float(_lengths(edges, spots, rate).mean())
        lo, hi = -MAX_RATE, MAX_RATE  # a positive rate packs lengths toward each bucket's floor, negative its top
        if not mean_at(hi) <= self.mean <= mean_at(lo):
            return lo if self.mean > mean_at(lo) else hi
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mean_at(mid) > self.mean else (lo, mid)
        return (lo + hi) / 2


WHOLE_MEAN = 1e-3  # a mean this close to a whole number, from one bucket: fixed lengths
MAX_RATE = 500.0  # the steepest shape, per bucket width: the lengths within 1/500 of the bucket's edge


def _lengths(edges: np.ndarray, spots: np.ndarray, rate: float) -> np.ndarray:
    """Whole token counts inside each bucket (lo, hi] at quantile `spot` of a truncated exponential of `rate`."""
    lo, hi = edges[:, 0], edges[:, 1]
    if abs(rate) < 1e-9:
        f = spots
    else:  # the inverse of the truncated exponential's CDF on [0, 1]
        f = -np.log1p(spots * math.expm1(-rate)) / rate
    whole = np.ceil(lo + (hi - lo) * f)
    return np.maximum(1, np.minimum(np.floor(hi), np.maximum(np.floor(lo) + 1, whole))).astype(np.int64)


@dataclass
class Measured:
    """What the server measured over the window: the figures the model's replay is judged against."""

    seconds: float
    tally: Bin  # every bin of the window merged

    def rate(self, name: str) -> float:
        """A counter's increase per second over the window."""
        return self.tally.increases.get(name, 0.0) / self.seconds if self.seconds else 0.0

    def quantile(self, family: str, q: float) -> float | None:
        """histogram_quantile over the window's buckets of a family."""
        return self.tally.quantile(family, q)

    def bounds(self, family: str) -> list[float]:
        """The bucket bounds vLLM used for a family (the model's values are read through the same ones)."""
        return sorted(self.tally.buckets.get(family, {}))

    def as_dict(self) -> dict[str, float | None]:
        """The headline figures, by the names the whatif document uses."""
        return {"ttft_p95_s": self.quantile("ttft", 0.95), "itl_p95_s": self.quantile("itl", 0.95),
                "queue_p95_s": self.quantile("queue", 0.95), "e2e_p95_s": self.quantile("e2e", 0.95),
                "preemptions_per_s": self.rate("preemptions"), "requests_per_s": self.rate("requests"),
                "generation_tokens_per_s": self.rate("generation_tokens"), "frontend_s": self.frontend_s()}

    def frontend_s(self) -> float | None:
        """Mean seconds a generation request spent in the API server outside vLLM's e2e latency (the HTTP handler's
        duration minus e2e): near 0 while the engine is the bottleneck; seconds when a CPU-starved frontend holds
        requests before the engine sees them, which the model (clients feeding the scheduler) leaves out."""
        inc = self.tally.increases
        if not inc.get("http_count") or not inc.get("e2e_count"):
            return None
        return max(0.0, inc["http_sum"] / inc["http_count"] - inc["e2e_sum"] / inc["e2e_count"])


@dataclass
class Workload:
    """One instance's workload over a window: how requests arrived, their lengths, and what was measured."""

    instance: str
    start_ms: int
    end_ms: int
    bin_s: float
    arrivals: list[float]  # open loop: requests that arrived in each bin
    clients: int | None  # closed loop: that many clients, each with one request outstanding
    prompt: LengthDist
    output: LengthDist
    prefix_hit_rate: float
    measured: Measured
    bins: list[Bin] = field(repr=False, default_factory=list)

    @property
    def seconds(self) -> float:
        """The window's length."""
        return (self.end_ms - self.start_ms) / 1000

    def requests(self, seed: int = 0, rate_factor: float = 1.0) -> list[SimRequest]:
        """The window's requests (arrival times from its start), reproducible by seed; rate_factor scales arrivals.

        A closed loop yields as many request shapes as the window could need, arrivals at 0: the clients
        send them in order as earlier ones return."""
        rng = random.Random(seed)
        if self.clients is not None:
            n = max(int(self.measured.tally.requests * max(rate_factor, 1.0) * 3), self.clients * 4)
            times = [0.0] * n
        else:
            times = []
            for i, expected in enumerate(self.arrivals):
                k = expected * rate_factor
                count = int(k) + (1 if rng.random() < k - int(k) else 0)
                times += sorted(i * self.bin_s + rng.random() * self.bin_s for _ in range(count))
        prompts = self.prompt.sample(len(times), rng)
        outputs = self.output.sample(len(times), rng)
        return [SimRequest(t, p, o, cached_tokens=min(p - 1, int(p * self.prefix_hit_rate)))
                for t, p, o in zip(times, prompts, outputs)]

    def worker_busy(self) -> float | None:
        """Cores vLLM's worker process ran (the sidecar's process collector) in the median bin that had a request
        or more running and counted steps; None without that reading (a Prometheus source) or under 2 such bins.
        The median, so that a bin the engine stopped or went idle in part of does not read as a lost core."""
        shares = sorted(b.increases["worker_cpu"] / b.seconds for b in self.bins
                        if "worker_cpu" in b.increases and b.increases.get("steps", 0.0) > 0
                        and b.gauge_seconds.get("running", 0.0) >= BUSY_RUNNING * b.seconds)
        return float(np.median(shares)) if len(shares) >= MIN_BUSY_BINS else None

    def describe(self) -> dict:
        """The workload block of the whatif document."""
        return {"mode": "closed loop" if self.clients is not None else "open loop", "clients": self.clients,
                "requests": round(self.measured.tally.requests, 1),
                "arrival_rate_rps": round(sum(self.arrivals) / self.seconds, 4) if self.seconds else None,
                "prompt_tokens_mean": round(self.prompt.mean, 1), "output_tokens_mean": round(self.output.mean, 1),
                "prefix_cache_hit_rate": round(self.prefix_hit_rate, 4),
                "frontend_s": _rounded(self.measured.frontend_s())}


def read_workload(engine: object, instance: str | None, start_ms: int, end_ms: int, bin_ms: int = 10_000) -> Workload:
    """The workload of `instance` (None: the one instance that served requests) over [start_ms, end_ms], from
    any engine (the store's or a Prometheus)."""
    bins = read_bins(engine, start_ms, end_ms, bin_ms, instance, FAMILIES)
    if instance is None:
        served = sorted({b.instance for b in bins if b.requests > 0})
        if len(served) > 1:
            raise NotEnoughTraffic(f"{len(served)} instances served requests in the window ({', '.join(served)}): "
                                   "the model is of one server; pick one with --instance")
        instance = served[0] if served else (bins[0].instance if bins else "")
    bins = [b for b in bins if b.instance == instance]
    # the window's totals from one span, not the bins' sum: a starved scraper's gap longer than a bin
    # leaves bins without two samples of a counter, whose increase the sum would lose
    span = read_span(engine, bins[0].end_ms - bin_ms, bins[-1].end_ms, instance, FAMILIES) if bins else []
    whole = span[0] if span else merged(bins)
    if not bins or whole.requests < MIN_REQUESTS or not whole.buckets.get("prompt") or not whole.buckets.get("output"):
        raise NotEnoughTraffic(
            f"{instance or 'no instance'}: {whole.requests:.0f} requests completed between the window's ends (the model needs "
            f"{MIN_REQUESTS} or more, with vllm:request_prompt_tokens and vllm:request_generation_tokens); "
            "widen --since or pick a busier window")
    tally = Bin(seconds=whole.seconds, instance=instance, end_ms=bins[-1].end_ms, increases=whole.increases,
                gauge_seconds=whole.gauge_seconds, buckets=whole.buckets)
    inc = whole.increases
    prompt = LengthDist.from_buckets(whole.buckets["prompt"], _mean(inc, "prompt_sum", "prompt_count"))
    output = LengthDist.from_buckets(whole.buckets["output"], _mean(inc, "output_sum", "output_count"))
    queries = inc.get("prefix_queries", 0.0)
    hit_rate = min(1.0, inc.get("prefix_hits", 0.0) / queries) if queries > 0 else 0.0
    bin_s = bin_ms / 1000
    return Workload(instance, bins[0].end_ms - bin_ms, bins[-1].end_ms, bin_s, _arrivals(bins), _clients(bins),
                    prompt, output, hit_rate, Measured(tally.seconds, tally), bins)


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _mean(inc: dict[str, float], total: str, count: str) -> float:
    return inc.get(total, 0.0) / inc[count] if inc.get(count) else 0.0


def _population(b: Bin) -> float:
    return (b.gauge_seconds.get("running", 0.0) + b.gauge_seconds.get("waiting", 0.0)) / b.seconds


def _arrivals(bins: list[Bin]) -> list[float]:
    """Requests that arrived per bin: those that completed plus the growth of the population in the system."""
    out, before = [], _population(bins[0]) if bins else 0.0
    for b in bins:
        now = _population(b)
        out.append(max(0.0, b.requests + now - before))
        before = now
    return out


def _clients(bins: list[Bin]) -> int | None:
    """The closed loop's client count, None when the load arrived on its own (see the module's docstring).

    The gauges are sampled moments (a busy host answers /metrics between engine steps), so they only
    say whether requests waited; the population comes from the counters by Little's law (completion
    rate x mean time in the server). A closed loop differs from an open loop that overloads the server
    in that its population does not grow: the last third of the window holds about as many as the first."""
    waited = [b for b in bins if b.gauge_seconds.get("waiting", 0.0) / b.seconds >= 0.5]
    if not bins or len(waited) < SATURATED_SHARE * len(bins):
        return None
    third = max(1, len(bins) // 3)
    first, last = (merged(part) for part in (bins[:third], bins[-third:]))
    population = [_littles_law(t) for t in (first, last, merged(bins))]
    if None in population or population[1] - population[0] > max(POPULATION_GROWTH * population[0], 3.0):
        return None
    return max(1, round(population[2]))


def _littles_law(t: Tally) -> float | None:
    """Requests in the server on average over a stretch: completion rate x mean end-to-end latency."""
    count = t.increases.get("e2e_count", 0.0)
    if count <= 0 or t.seconds <= 0:
        return None
    return t.rate * t.increases.get("e2e_sum", 0.0) / count
