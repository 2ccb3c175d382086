"""The config_snapshots table: which configuration was in force at a time, on a real DuckDB file."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.store.config_snapshots import (config_snapshot_at, config_snapshots_after,
                                                        first_config_snapshot, insert_config_snapshot)
from vllm_sentinel.agent.store.db import Store

T0 = 1_764_000_000_000


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        insert_config_snapshot(s, "a:8000", T0, '{"max_num_seqs": 256}', '{"max_num_seqs": "flag --max-num-seqs"}')
        insert_config_snapshot(s, "a:8000", T0 + 60_000, '{"max_num_seqs": 128}', "{}")
        insert_config_snapshot(s, "b:8000", T0 + 30_000, '{"max_num_seqs": 8}', "{}")
        yield s


def test_the_snapshot_in_force_is_the_newest_at_or_before_the_time(store):
    assert config_snapshot_at(store, "a:8000", T0) == (T0, '{"max_num_seqs": 256}',
                                                        '{"max_num_seqs": "flag --max-num-seqs"}')
    assert config_snapshot_at(store, "a:8000", T0 + 59_999)[0] == T0
    assert config_snapshot_at(store, "a:8000", T0 + 60_000)[1] == '{"max_num_seqs": 128}'
    assert config_snapshot_at(store, "a:8000", T0 + 10 ** 9)[0] == T0 + 60_000


def test_no_snapshot_before_the_first_and_instances_do_not_mix(store):
    assert config_snapshot_at(store, "a:8000", T0 - 1) is None
    assert config_snapshot_at(store, "b:8000", T0 + 29_999) is None  # a's snapshot is not b's
    assert config_snapshot_at(store, "c:8000", T0 + 10 ** 9) is None
    assert first_config_snapshot(store, "a:8000")[0] == T0
    assert first_config_snapshot(store, "c:8000") is None


def test_changes_in_a_window_exclude_its_start_and_include_its_end(store):
    assert [r[0] for r in config_snapshots_after(store, "a:8000", T0, T0 + 60_000)] == [T0 + 60_000]
    assert [r[0] for r in config_snapshots_after(store, "a:8000", T0 - 1, T0 + 60_000)] == [T0, T0 + 60_000]
    assert config_snapshots_after(store, "a:8000", T0, T0 + 59_999) == []


def test_snapshots_survive_reopening_read_only(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        insert_config_snapshot(s, "a:8000", T0, "{}", "{}")
    with Store.open(path, read_only=True) as s:
        assert config_snapshot_at(s, "a:8000", T0) == (T0, "{}", "{}")
