"""Reads of series, samples and events over hourly partitions: windows, staleness markers, newest labels."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.store.db import HOUR_MS, Store, table_exists
from vllm_sentinel.agent.store.events_table import last_capture_refusal, last_scrape_errors
from vllm_sentinel.agent.store.sample_reads import (instances_with_samples, newest_labels, samples_of_metrics,
                                                    values_between)
from vllm_sentinel.agent.store.series_table import (has_gpu_series, metrics_present, series_count_by_instance,
                                                    series_to_export)
from vllm_sentinel.collectors.base import Batch, Event

T0 = 1_795_000_000_000 - (1_795_000_000_000 % HOUR_MS)  # an hour boundary
INFO = "vllm:cache_config_info"


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        a = Batch(instance="a:8000", ts_ms=T0)
        a.add(INFO, {"engine": "1", "block_size": "32"}, 1.0, T0 + 5_000)
        a.add(INFO, {"engine": "0", "block_size": "16"}, 1.0, T0 + 5_000)
        a.add(INFO, {"engine": "0", "block_size": "8"}, 1.0, T0 + 1_000)
        a.add("vllm:num_requests_waiting", {}, 3.0, T0 + 1_000)
        a.add("vllm:num_requests_waiting", {}, None, T0 + 2_000)  # staleness marker
        a.add("vllm:num_requests_waiting", {}, 4.0, T0 + HOUR_MS + 1_000)  # the next hour's partition
        a.sources["vllm:num_requests_waiting"] = "vllm:num_requests_waiting_old"
        b = Batch(instance="b:8000", ts_ms=T0)
        b.add("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, 50.0, T0 + 3_000)
        b.events.append(Event(T0 + 3_000, "b:8000", "scrape_error", {}, "timeout"))
        b.events.append(Event(T0 + 4_000, "b:8000", "scrape_error", {}, "refused"))
        b.events.append(Event(T0 + 4_000, "b:8000", "pyspy_capture", {"status": "permission_denied"},
                              "ptrace not permitted"))
        b.events.append(Event(T0 + 5_000, "b:8000", "pyspy_capture", {"status": "ok"}, "py-spy dump: 3 samples"))
        s.append_many([a, b])
        yield s


def test_instances_seen_in_a_window_that_excludes_its_start(store):
    assert instances_with_samples(store, T0, T0 + 3_000) == ["a:8000", "b:8000"]
    assert instances_with_samples(store, T0 + 3_000, T0 + HOUR_MS) == ["a:8000"]
    assert instances_with_samples(store, T0 + 5_000, T0 + HOUR_MS) == []


def test_values_of_a_window_leave_staleness_markers_out_and_span_partitions(store):
    waiting = next(r[0] for r in series_to_export(store, "a:8000") if r[2] == "vllm:num_requests_waiting")
    mine = [(ts, v) for sid, ts, v in values_between(store, T0, T0 + 2 * HOUR_MS) if sid == waiting]
    assert mine == [(T0 + 1_000, 3.0), (T0 + HOUR_MS + 1_000, 4.0)]


def test_samples_of_named_metrics_keep_staleness_markers(store):
    got = samples_of_metrics(store, {"vllm:num_requests_waiting"}, T0, T0 + HOUR_MS)
    assert sorted(got["ts"].tolist()) == [T0 + 1_000, T0 + 2_000]  # the marker at 2 s included
    assert set(got["metric"].tolist()) == {"vllm:num_requests_waiting"}
    assert len(samples_of_metrics(store, None, T0, T0 + HOUR_MS)["ts"]) == 6
    assert list(samples_of_metrics(store, None, T0, T0 + HOUR_MS)["instance"]) == ["a:8000"] * 5 + ["b:8000"]


def test_newest_labels_prefer_the_latest_sample_then_the_lowest_engine(store):
    assert newest_labels(store, INFO, "a:8000", T0 + 10_000, 60_000)["block_size"] == "16"
    assert newest_labels(store, INFO, "a:8000", T0 + 4_999, 60_000)["block_size"] == "8"
    assert newest_labels(store, INFO, "a:8000", T0 + 10_000, 9_000) == {"engine": "0", "block_size": "16"}
    assert newest_labels(store, INFO, "a:8000", T0 + 70_000, 60_000) is None  # older than the lookback
    assert newest_labels(store, INFO, "b:8000", T0 + 10_000, 60_000) is None
    # past the last minute, within the lookback: found by the second, whole read
    assert newest_labels(store, INFO, "a:8000", T0 + 20 * 60_000, HOUR_MS) == {"engine": "0", "block_size": "16"}
    assert newest_labels(store, INFO, "a:8000", T0 + 20 * 60_000, 10 * 60_000) is None


def test_series_dictionary_reads(store):
    assert metrics_present(store, ["DCGM_FI_DEV_GPU_UTIL", "vllm:nothing"]) == {"DCGM_FI_DEV_GPU_UTIL"}
    assert series_count_by_instance(store) == {"a:8000": 4, "b:8000": 1}
    assert has_gpu_series(store) and has_gpu_series(store, "b:8000") and not has_gpu_series(store, "a:8000")
    exported = {r[2]: r[3] for r in series_to_export(store)}
    assert exported["vllm:num_requests_waiting"] == "vllm:num_requests_waiting_old"  # the name as scraped
    assert {r[1] for r in series_to_export(store, "b:8000")} == {"b:8000"}


def test_events_give_the_last_scrape_error_and_the_last_capture_refusal(store):
    assert last_scrape_errors(store, T0, T0 + 10_000) == {"b:8000": "refused"}
    assert last_scrape_errors(store, T0 + 4_000, T0 + 10_000) == {}
    # an ok capture after the refusal does not hide why the earlier one failed
    assert last_capture_refusal(store, "b:8000", T0, T0 + 10_000) == "ptrace not permitted"
    assert last_capture_refusal(store, "b:8000", T0 + 4_001, T0 + 10_000) is None
    assert last_capture_refusal(store, "a:8000", T0, T0 + 10_000) is None


def test_table_exists(store):
    assert table_exists(store, "config_snapshots") and not table_exists(store, "no_such_table")
