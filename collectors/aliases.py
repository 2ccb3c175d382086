"""The one alias table: old and alternate vLLM metric names -> the canonical vLLM 0.32 names.

Covers V0 through 0.33, each name checked against that version's metrics. Two kinds:
* spelling: OpenMetrics scrapes without `escaping=allow-utf-8` write `vllm_x` for `vllm:x`
  (prometheus_client#1177);
* renames: a metric family that vLLM renamed, with every sample suffix it exposes.
An alias applies only when its canonical family is absent from the same scrape: 0.10-0.12 serve
old and new names side by side, and two real series must never merge into one.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["FAMILY_RENAMES", "canonical_names", "resolve"]

# Old family name -> canonical family name (names as registered, before `_total` etc.).
FAMILY_RENAMES: dict[str, str] = {
    # V1 0.9.2 introduced kv_cache_usage_perc; gpu_ deprecated 0.10, hidden 0.11, removed 0.12.
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    # V1 prefix-cache counters (tokens); same schedule as above (PR #18354, #24245, #29330).
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    # Per-iteration latency, renamed in 0.11 (PR #24110), removed 0.13 (PR #32661); same buckets.
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
    # V0 duplicate of queue time, removed 0.10 (PR #15458, #18837).
    "vllm:time_in_queue_requests": "vllm:request_queue_time_seconds",
}
# Not aliased on purpose (different meaning or unit, or the label decides the target):
# vllm:gpu_prefix_cache_hit_rate (a V0 ratio gauge, not counters), vllm:num_requests_swapped and
# vllm:cpu_cache_usage_perc (no V1 counterpart), vllm:avg_*_throughput_toks_per_s (gauges, not
# counters), vllm:kv_offload_total_{bytes,time}/kv_offload_size (split by the transfer_type label).

# Every sample name a family exposes in text format or OpenMetrics.
_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count", "_info", "_gcount", "_gsum")

_SAMPLE_RENAMES: dict[str, str] = {
    old + suffix: new + suffix for old, new in FAMILY_RENAMES.items() for suffix in _SUFFIXES
}
_FAMILY_OF_SAMPLE: dict[str, str] = {
    name + suffix: name
    for pair in FAMILY_RENAMES.items() for name in pair for suffix in _SUFFIXES
}
_CANONICAL_SAMPLES: dict[str, tuple[str, ...]] = {
    new: tuple(new + suffix for suffix in _SUFFIXES) for new in FAMILY_RENAMES.values()
}


def _unescaped(name: str) -> str | None:
    """'vllm_num_requests_running' -> 'vllm:num_requests_running'; None if not that spelling."""
    if name.startswith("vllm_") and not name.startswith("vllm_sentinel_"):
        return "vllm:" + name[5:]
    return None


@lru_cache(maxsize=64)
def canonical_names(names_in_scrape: frozenset[str]) -> dict[str, str]:
    """Sample names that need renaming in this scrape -> their canonical name (others omitted).

    The dict is cached and shared: read it, never change it.

    >>> canonical_names(frozenset({"vllm_gpu_cache_usage_perc", "vllm:num_requests_running"}))
    {'vllm_gpu_cache_usage_perc': 'vllm:kv_cache_usage_perc'}
    >>> canonical_names(frozenset({"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"}))
    {}
    """
    # Step 1: the underscore spelling, unless the colon spelling is also present.
    spelled: dict[str, str] = {}
    for name in names_in_scrape:
        colon = _unescaped(name)
        spelled[name] = colon if colon is not None and colon not in names_in_scrape else name
    present = set(spelled.values())
    # Step 2: renamed families, unless any sample of the canonical family is present.
    result: dict[str, str] = {}
    for source, name in spelled.items():
        target = _SAMPLE_RENAMES.get(name)
        if target is not None:
            canonical_family = FAMILY_RENAMES[_FAMILY_OF_SAMPLE[name]]
            if not any(sample in present for sample in _CANONICAL_SAMPLES[canonical_family]):
                name = target
        if name != source:
            result[source] = name
    return result


def resolve(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Canonical names for one scrape's sample names, and the renames applied (source -> canonical).

    >>> resolve(["vllm:gpu_cache_usage_perc", "up"])
    (['vllm:kv_cache_usage_perc', 'up'], {'vllm:gpu_cache_usage_perc': 'vllm:kv_cache_usage_perc'})
    """
    renames = canonical_names(frozenset(names))
    if not renames:
        return names, renames
    get = renames.get
    return [get(name, name) for name in names], renames
