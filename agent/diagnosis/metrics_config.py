"""The live configuration of vLLM instances from their metrics alone, for when no command line is known.

A fleet's Prometheus (or an ingested dump) holds `vllm:cache_config_info`, what the engine
resolved: block size, KV blocks, cache dtype, prefix caching, and through kv_cache_size_tokens /
kv_cache_max_concurrency the max model length. It does not hold the command line, so:

* `--max-num-seqs` is inferred from behaviour: the most requests `vllm:num_requests_running`
  showed while others waited and the KV cache had room, since the server last started (a restart
  may change the flag: the plateau of the process before it says nothing about this one). The scheduler admits no more than
  --max-num-seqs, so a queue with KV room left means running is at the cap. Where the server has
  `vllm:num_requests_waiting_by_reason` (0.32), only requests waiting for capacity count: requests
  deferred by a transient constraint (LoRA budget, KV transfer, a blocked request) wait whatever
  the cap, so deferred-only waiting proves nothing about it;
* every other flag falls back to vLLM's default for the platform the cache info shows.

Each such value's source says it is inferred and from what. Works over any PromQL engine (the
DuckDB store's or a remote Prometheus), so both sources compute the same fixes from the same data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_sentinel.agent.diagnosis.liveconfig import CACHE_INFO_METRIC, LiveConfig, build_live_config
from vllm_sentinel.agent.promql.remote import instant_all, range_all
from vllm_sentinel.collectors.timefmt import iso_seconds

# behaviour is read over at least this much history before the window's end
INFER_HISTORY_MS = 3_600_000
# "the KV cache had room": below this share used, running is capped by --max-num-seqs, not by KV blocks
KV_ROOM = 0.9
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
# requests that wait for a slot: the capacity reason where the server splits waiting by reason, else all waiting
WAITING_FOR_CAPACITY = (
    f'(sum by (instance) ({WAITING_BY_REASON}{{reason="capacity"}}) > 0)'
    f" or (sum by (instance) (vllm:num_requests_waiting) > 0 unless on (instance) {WAITING_BY_REASON})"
)
RUNNING_WHILE_QUEUED = (
    "max by (instance) (vllm:num_requests_running)"
    f" and on (instance) ({WAITING_FOR_CAPACITY})"
    f" and on (instance) (max by (instance) (vllm:kv_cache_usage_perc) < {KV_ROOM})"
)
NO_ARGV_METRICS = "the command line is not in the metrics"
# the API server's start time: the sidecar's process collector, else vLLM's own process metrics
SERVER_START_SELECTORS = ('vllm_sentinel_process_start_time_seconds{role="api_server"}', "process_start_time_seconds")
SERVER_START_EXPRS = tuple(f"max by (instance) ({sel})" for sel in SERVER_START_SELECTORS)


def _cache_info_by_instance(result: Any) -> dict[str, dict[str, str]]:
    """The cache_config_info labels per instance (engine 0, else the lowest engine label)."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for s in result if isinstance(result, list) else []:
        labels = dict(s.labels)
        inst = labels.get("instance")
        if inst is None:
            continue
        engine = labels.get("engine", "")
        if inst not in out or engine < out[inst][0]:
            out[inst] = (engine, labels)
    return {i: labels for i, (_e, labels) in out.items()}


def _since(lo_ms: int, started_ms: int | None) -> str:
    """Where the behaviour was read from: the history's start, or the server's start when later."""
    if started_ms is not None and started_ms > lo_ms:
        return f"{iso_seconds(started_ms)} (the server's start)"
    return iso_seconds(lo_ms)


def _started(results: list[Any]) -> dict[str, int]:
    """Each instance's server start (ms), from the first of SERVER_START_EXPRS that has it."""
    out: dict[str, int] = {}
    for result in results:
        for s in result if isinstance(result, list) else []:
            inst = dict(s.labels).get("instance")
            if inst is not None and inst not in out and s.value == s.value:
                out[inst] = int(s.value * 1000)
    return out


def _peaks(series: list[Any], since: dict[str, int] | None = None) -> dict[str, float]:
    """The highest value of each instance's series from its `since` (ms) on:
    [Series({instance: a}, [(t, 3), (t2, 4)])] -> {'a': 4}."""
    out: dict[str, float] = {}
    for s in series:
        inst = dict(s.labels).get("instance")
        start = (since or {}).get(inst or "", 0)
        values = [v for t, v in s.points if v == v and t >= start]
        if inst is not None and values:
            out[inst] = max(out.get(inst, float("-inf")), max(values))
    return out


def mark_inferred(cfg: LiveConfig) -> LiveConfig:
    """Defaults taken without a command line are guesses: their sources say they are inferred."""
    for name, src in list(cfg.sources.items()):
        if src.startswith("default") and cfg.known(name):
            cfg.sources[name] = f"inferred ({NO_ARGV_METRICS}): {src}"
    return cfg


def metrics_configs(engine: Any, instances: Sequence[str], end_ms: int, step_ms: int,
                    start_ms: int | None = None) -> dict[str, LiveConfig]:
    """Each instance's configuration at `end_ms` from its metrics over [min(start, end - 1 h), end_ms]."""
    if not instances:
        return {}
    lo = min(end_ms - INFER_HISTORY_MS, start_ms if start_ms is not None else end_ms)
    lo = lo // step_ms * step_ms
    span_s = max(1, (end_ms - lo) // 1000)
    [info, by_reason, *starts] = instant_all(engine, [
        (f"last_over_time({CACHE_INFO_METRIC}[{span_s}s])", end_ms),
        (f"count by (instance) (last_over_time({WAITING_BY_REASON}[{span_s}s]))", end_ms),
        *[(f"max by (instance) (last_over_time({sel}[{span_s}s]))", end_ms) for sel in SERVER_START_SELECTORS]])
    [running] = range_all(engine, [(RUNNING_WHILE_QUEUED, lo, end_ms, step_ms)])
    started = _started(starts)
    caches, peaks = _cache_info_by_instance(info), _peaks(running, started)
    split = {dict(s.labels).get("instance") for s in by_reason} if isinstance(by_reason, list) else set()
    out = {}
    for inst in instances:
        cfg = build_live_config(inst, caches.get(inst), argv=None, ts_ms=end_ms)
        peak = peaks.get(inst)
        if peak is not None and peak >= 1:
            waited = ('others waited for capacity (vllm:num_requests_waiting_by_reason{reason="capacity"}; '
                      "deferred requests not counted)" if inst in split
                      else "others waited (vllm:num_requests_waiting)")
            cfg.set("max_num_seqs", int(peak),
                    f"inferred from behaviour: at most {int(peak)} requests ran (vllm:num_requests_running) while "
                    f"{waited} and the KV cache was under {KV_ROOM:.0%} used, {_since(lo, started.get(inst))} .. "
                    f"{iso_seconds(end_ms)}; the scheduler admits no more than --max-num-seqs")
        out[inst] = mark_inferred(cfg)
    return out
