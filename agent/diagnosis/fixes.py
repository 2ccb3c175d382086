"""Fix computations: from a live configuration and an incident's evidence, a concrete parameter change.

Each function is registered under a name a rule file uses in `fix: [{param: ..., compute: NAME}]`
(agent/diagnosis/fix_registry.py); importing this module loads every one of them. A fix
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
| prompt_tokens_p25 .. prompt_tokens_p99 | histogram_quantile(q, rate(vllm:request_prompt_tokens_bucket[2m])) |
| prompt_spread_ratio | the p95/median prompt-length ratio from which prompts count as bimodal (rule param) |
| iteration_tokens_p95 | histogram_quantile(0.95, rate(vllm:iteration_tokens_total_bucket[5m])) |
| gpu_memory_used_ratio | max_over_time(DCGM_FI_DEV_FB_USED / (FB_USED + FB_FREE)) (0..1) |
| replicas | instances serving the same model (count by model_name(up)) |
| prefix_cache_hit_ratio | rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total) (0..1) |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_sentinel.agent.diagnosis import fixes_fleet, fixes_kv_memory, fixes_memory, fixes_prefix, fixes_scheduling
from vllm_sentinel.agent.diagnosis.fix_registry import FIXES, Fix, as_live_config
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

# the modules whose @register_fix decorators fill FIXES when they are imported
FIX_MODULES = (fixes_fleet, fixes_kv_memory, fixes_memory, fixes_prefix, fixes_scheduling)
__all__ = ["FIXES", "FIX_MODULES", "Fix", "compute"]


def compute(name: str, cfg: LiveConfig | Mapping[str, Any], evidence: Mapping[str, float | None]) -> Fix | None:
    """Run the fix named `name`; a plain mapping is taken as a configuration snapshot's values."""
    if not isinstance(cfg, LiveConfig):
        cfg = as_live_config(cfg)
    return FIXES[name](cfg, evidence)
