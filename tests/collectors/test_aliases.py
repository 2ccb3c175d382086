"""collectors/aliases.py: old vLLM names become canonical, but two real series never merge."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.collectors.aliases import FAMILY_RENAMES, canonical_names, resolve
from vllm_sentinel.collectors.exposition import parse

FIXTURES = Path(__file__).parent / "fixtures"


def renames(*names: str) -> dict[str, str]:
    return canonical_names(frozenset(names))


def test_kv_usage_renamed_when_canonical_absent() -> None:
    assert renames("vllm:gpu_cache_usage_perc") == {"vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc"}


def test_no_rename_when_both_old_and_new_are_served() -> None:
    # 0.10/0.11 serve both: renaming would merge two real series into one
    assert renames("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc") == {}
    assert renames("vllm:gpu_prefix_cache_hits_total", "vllm:prefix_cache_hits_total") == {}


@pytest.mark.parametrize("suffix", ["_bucket", "_sum", "_count", "_created"])
def test_histogram_suffixes_follow_the_family(suffix: str) -> None:
    old = "vllm:time_per_output_token_seconds"
    assert renames(old + suffix) == {old + suffix: "vllm:inter_token_latency_seconds" + suffix}
    # any sample of the canonical family present blocks the whole old family (no half-merged histogram)
    assert renames(old + suffix, "vllm:inter_token_latency_seconds_count") == {}


def test_counter_total_and_created() -> None:
    got = renames("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_created")
    assert got == {"vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
                   "vllm:gpu_prefix_cache_queries_created": "vllm:prefix_cache_queries_created"}


def test_v0_queue_time_duplicate() -> None:
    assert renames("vllm:time_in_queue_requests_sum") == {
        "vllm:time_in_queue_requests_sum": "vllm:request_queue_time_seconds_sum"}
    assert renames("vllm:time_in_queue_requests_sum", "vllm:request_queue_time_seconds_sum") == {}


def test_underscore_spelling_and_rename_combine() -> None:
    assert renames("vllm_gpu_cache_usage_perc") == {"vllm_gpu_cache_usage_perc": "vllm:kv_cache_usage_perc"}
    assert renames("vllm_num_requests_running") == {"vllm_num_requests_running": "vllm:num_requests_running"}
    # both spellings in one scrape: leave them apart
    assert renames("vllm_num_requests_running", "vllm:num_requests_running") == {}
    # old name in underscores, new name in underscores: both get the colon, no merge
    assert renames("vllm_gpu_cache_usage_perc", "vllm_kv_cache_usage_perc") == {
        "vllm_gpu_cache_usage_perc": "vllm:gpu_cache_usage_perc",
        "vllm_kv_cache_usage_perc": "vllm:kv_cache_usage_perc"}


def test_other_names_untouched() -> None:
    names = ("python_gc_objects_collected_total", "http_requests_total", "process_cpu_seconds_total",
             "vllm_sentinel_scrape_duration_seconds", "vllm:num_requests_swapped",
             "vllm:gpu_prefix_cache_hit_rate", "vllm:num_requests_running")
    assert renames(*names) == {}


def test_not_aliased_families_have_different_meaning() -> None:
    # a V0 ratio gauge is not the V1 counters: no alias may turn it into one
    assert "vllm:gpu_prefix_cache_hit_rate" not in FAMILY_RENAMES
    assert set(FAMILY_RENAMES.values()).isdisjoint(FAMILY_RENAMES)  # no chains


def test_openmetrics_capture_resolves_to_the_text_format_names() -> None:
    om = parse((FIXTURES / "vllm-0.32.0-dp1-rendered.openmetrics.txt").read_text())
    text = parse((FIXTURES / "vllm-0.32.0-dp2-rendered.prom.txt").read_text())
    names, applied = resolve(om.names)
    assert applied  # the capture spells every vllm: sample vllm_
    assert {n for n in names if "vllm" in n} == {n for n in text.names if "vllm" in n}


def test_real_032_capture_needs_no_rename() -> None:
    p = parse((FIXTURES / "vllm-0.32.0-cpu-after-preemptions.prom.txt").read_text())
    names, applied = resolve(p.names)
    assert applied == {} and names is p.names  # the common case costs one cached lookup


def test_010_style_scrape_keeps_every_series_apart() -> None:
    # names served side by side by vLLM 0.10 (production-stack#617 capture), plus a V0-only name
    text = """\
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 0.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 32.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 32.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 3.0
"""
    p = parse(text)
    names, applied = resolve(p.names)
    assert len(set(zip(names, p.labels))) == len(p.names)
    assert applied == {"vllm:time_per_output_token_seconds_count": "vllm:inter_token_latency_seconds_count"}


def test_resolution_is_cached_per_name_set() -> None:
    names = frozenset({"vllm:gpu_cache_usage_perc", "vllm:num_requests_running", "x_cache_test"})
    canonical_names(names)
    hits = canonical_names.cache_info().hits
    assert canonical_names(frozenset(set(names))) == canonical_names(names)
    assert canonical_names.cache_info().hits == hits + 2
