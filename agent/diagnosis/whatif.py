"""`whatif`: a window's recorded workload replayed through the calibrated model of the server, as configured and
as the operator asks (`--set`, `--replicas`, `--rate`), with latency quantiles, preemptions, throughput and
goodput under the objectives. Predictions are withheld when the model's replay of the window itself
misses what the server measured by more than the calibration bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_sentinel.agent.diagnosis.compare_slo import bound_under
from vllm_sentinel.agent.diagnosis.metrics_config import metrics_configs
from vllm_sentinel.agent.diagnosis.sim_calibrate import (Unrepresentable, calibrate, engine_config, observed_like,
                                                         replica_groups, run_model)
from vllm_sentinel.agent.diagnosis.sim_results import SimResult
from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig
from vllm_sentinel.agent.diagnosis.sim_workload import Workload, read_workload
from vllm_sentinel.agent.diagnosis.vllm_defaults import PLATFORM_CPU
from vllm_sentinel.agent.diagnosis.whatif_knobs import apply_sets
from vllm_sentinel.agent.diagnosis.window import store_config_for
from vllm_sentinel.collectors.timefmt import iso_seconds

# instance -> its live configuration (values and sources), or None where none is known
ConfigLookup = Callable[[str], tuple[Mapping[str, Any], Mapping[str, str]] | None]


@dataclass(frozen=True)
class WhatIfQuery:
    """The window, the instance, the change asked for and the objectives goodput is counted against."""

    start_ms: int
    end_ms: int
    instance: str | None = None
    sets: tuple[tuple[str, str], ...] = ()
    replicas: int = 1
    rate_factor: float = 1.0
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    slo_source: str = "defaults"
    bin_ms: int = 10_000
    seed: int = 0

    @property
    def asks_change(self) -> bool:
        """Whether the operator asked for anything beyond the configuration as it ran."""
        return bool(self.sets) or self.replicas != 1 or self.rate_factor != 1.0

    def as_params(self) -> dict[str, Any]:
        """The query as the daemon's request parameters."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        out["sets"] = [list(s) for s in self.sets]
        return out

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "WhatIfQuery":
        """The query from the daemon's request parameters."""
        kinds = {"start_ms": int, "end_ms": int, "replicas": int, "bin_ms": int, "seed": int, "instance": str,
                 "slo_source": str, "rate_factor": float, "ttft_slo_s": float, "tpot_slo_s": float}
        values = {k: kinds[k](v) for k, v in params.items() if k in kinds}
        return cls(**values, sets=tuple((str(a), str(b)) for a, b in params.get("sets") or ()))


@dataclass
class Scenario:
    """One configuration the model answers for: what changed, and its prediction (None while withheld)."""

    name: str
    changes: list[str]
    replicas: int = 1
    rate_factor: float = 1.0
    predicted: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The scenario's block of the document."""
        return asdict(self)


def predicted(result: SimResult, workload: Workload, replicas: int, query: WhatIfQuery) -> dict[str, Any]:
    """A scenario's figures: p50/p95 per signal (p95s read through vLLM's buckets, as the server's would be),
    preemptions, throughput and goodput of all replicas together."""
    seen = observed_like(result, workload)
    read_at = objectives_read_at(workload, query)
    out: dict[str, Any] = {name: _r(result.quantile(signal, 0.5)) for name, signal in (
        ("ttft_p50_s", "ttft"), ("itl_p50_s", "itl"), ("tpot_p50_s", "tpot"), ("queue_p50_s", "queue"),
        ("e2e_p50_s", "e2e"))}
    out.update({"ttft_p95_s": _r(seen["ttft_p95_s"]), "itl_p95_s": _r(seen["itl_p95_s"]),
                "tpot_p95_s": _r(result.quantile("tpot", 0.95)), "queue_p95_s": _r(result.quantile("queue", 0.95)),
                "e2e_p95_s": _r(result.quantile("e2e", 0.95)),
                "preemptions_per_s": _r(result.preemptions_per_s() * replicas),
                "requests_per_s": _r(seen["requests_per_s"] * replicas),
                "generation_tokens_per_s": _r(seen["generation_tokens_per_s"] * replicas),
                "goodput_rps": _r(result.goodput(*read_at) * replicas),
                "slo_attainment": _r(result.attainment(*read_at)),
                "unfinished": result.arrived - int(result.finished.sum()) - result.num_rejected,
                "rejected": result.num_rejected})
    return out


RATES = ("preemptions_per_s", "requests_per_s", "generation_tokens_per_s", "goodput_rps", "unfinished", "rejected")


def blend(parts: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """All replicas' figures from one replica's per group (figures, replicas like it): rates summed, attainment
    weighted by requests, latencies those of the busiest group (it holds the tail)."""
    out = dict(parts[0][0])
    for key in RATES:
        values = [(p.get(key), n) for p, n in parts]
        out[key] = None if any(v is None for v, _n in values) else _r(sum(v * n for v, n in values))
    served = [((p.get("requests_per_s") or 0.0) * n, p.get("slo_attainment")) for p, n in parts]
    total = sum(w for w, _a in served)
    if total and all(a is not None for _w, a in served):
        out["slo_attainment"] = _r(sum(w * a for w, a in served) / total)
    return out


def objectives_read_at(workload: Workload, query: WhatIfQuery) -> tuple[float, float]:
    """The TTFT and TPOT thresholds goodput is counted at: the largest of vLLM's bucket bounds at or under each
    objective, as `compare` reads the server's histograms (a 2 s objective on buckets ..1, 2.5.. reads at 1 s),
    so a predicted goodput is the figure `compare` will measure; the objective itself where no bounds are known."""
    def at(family: str, objective: float) -> float:
        bounds = workload.measured.bounds(family)
        if not bounds:
            return objective
        bound = bound_under(bounds, objective)
        return 0.0 if bound is None else bound
    # vLLM's per-request TPOT histogram has the inter-token latency's bounds
    return at("ttft", query.ttft_slo_s), at("itl", query.tpot_slo_s)


# a named change the model answers beside the one asked: (name, --set pairs, replicas)
Candidate = tuple[str, tuple[tuple[str, str], ...], int]


def whatif(engine: object, configs: ConfigLookup, query: WhatIfQuery, source: str = "",
           candidates: Sequence[Candidate] = ()) -> dict:
    """The whatif document: workload, configuration, calibration, and each scenario's prediction (as configured,
    the query's change when it asks one, then each candidate).

    Raises NotEnoughTraffic, Unrepresentable or BadKnob with a message that names the fix."""
    workload = read_workload(engine, query.instance, query.start_ms, query.end_ms, query.bin_ms)
    found = configs(workload.instance)
    if found is None:
        raise Unrepresentable(f"{workload.instance}: no configuration is known (no sidecar snapshot and no "
                              "vllm:cache_config_info): the model needs its KV blocks and scheduler limits")
    values, sources = found
    current = engine_config(values)
    calibration = calibrate(workload, current, query.seed, busy_wait=values.get("platform") == PLATFORM_CPU)
    scenarios = [Scenario("as configured", [], config=_config(current))]
    if query.asks_change:
        changed, words = apply_sets(current, query.sets, values)
        words += [f"replicas 1 -> {query.replicas}"] * (query.replicas != 1)
        words += [f"arrival rate x{query.rate_factor:g}"] * (query.rate_factor != 1.0)
        scenarios.append(Scenario("asked", words, query.replicas, query.rate_factor, config=_config(changed)))
    for name, sets, replicas in candidates:
        changed, words = apply_sets(current, sets, values)
        words += [f"replicas 1 -> {replicas}"] * (replicas != 1)
        scenarios.append(Scenario(name, words, replicas, 1.0, config=_config(changed)))
    if calibration.withheld is None:
        for sc in scenarios:
            cfg = EngineConfig(**sc.config)
            parts = [(predicted(run_model(workload, cfg, calibration.step_time, query.seed, sc.rate_factor,
                                          sc.replicas, clients), workload, 1, query), n)
                     for clients, n in replica_groups(workload, sc.rate_factor, sc.replicas)]
            sc.predicted = blend(parts)
    return {
        "window": {"start": iso_seconds(workload.start_ms), "end": iso_seconds(workload.end_ms)},
        "source": source, "instance": workload.instance,
        "objectives": {"ttft_p95_s": query.ttft_slo_s, "tpot_p95_s": query.tpot_slo_s, "source": query.slo_source,
                       "read_at": dict(zip(("ttft_s", "tpot_s"), objectives_read_at(workload, query)))},
        "workload": workload.describe(),
        "configuration": {name: {"value": values.get(key), "source": sources.get(key, "")}
                          for name, key in _CONFIG_SHOWN},
        "calibration": calibration.as_dict(),
        "withheld": calibration.withheld,
        "scenarios": [sc.as_dict() for sc in scenarios],
    }


_CONFIG_SHOWN = (("--max-num-seqs", "max_num_seqs"), ("--max-num-batched-tokens", "max_num_batched_tokens"),
                 ("num_gpu_blocks", "num_gpu_blocks"), ("block_size", "block_size"),
                 ("--max-model-len", "max_model_len"), ("chunked prefill", "enable_chunked_prefill"),
                 ("--scheduling-policy", "scheduling_policy"))


def _config(cfg: EngineConfig) -> dict[str, Any]:
    return asdict(cfg)


def _r(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)



def store_configs(store: Any, start_ms: int, end_ms: int) -> ConfigLookup:
    """instance -> the configuration in force at the window's end: the sidecar's snapshot, else what the metrics
    show (an ingested dump), each value with its source."""
    lookup = store_config_for(store, start_ms, end_ms, CONFIG_STEP_MS)

    def configs(instance: str) -> tuple[Mapping[str, Any], Mapping[str, str]] | None:
        cfg = lookup(instance)
        return (cfg.values, cfg.sources) if cfg else None
    return configs


def remote_configs(engine: Any, start_ms: int, end_ms: int) -> ConfigLookup:
    """instance -> the configuration a Prometheus' metrics show at the window's end."""
    def configs(instance: str) -> tuple[Mapping[str, Any], Mapping[str, str]] | None:
        cfg = metrics_configs(engine, [instance], end_ms, CONFIG_STEP_MS, start_ms).get(instance)
        return (cfg.values, cfg.sources) if cfg else None
    return configs


CONFIG_STEP_MS = 15_000
