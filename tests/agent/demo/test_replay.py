"""`demo --replay`: the shipped recording of a real vLLM CPU session yields the incidents it was made to show."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from vllm_sentinel.agent.demo.replay import (ReplayError, default_recording, load_metadata, metadata_path,
                                             run_replay)
from vllm_sentinel.agent.store.db import Store


@pytest.fixture(scope="module")
def replayed() -> dict:
    return run_replay()


def test_recording_is_small_and_documented():
    rec = default_recording()
    assert rec.exists(), f"{rec} missing: record it with reports/recordings/record_session.py"
    assert rec.stat().st_size < 300 * 1024
    meta = load_metadata(rec)
    assert meta["config_snapshots"], "the session's configuration snapshots are needed for concrete fixes"
    assert (rec.parent / "README.md").exists()
    first = gzip.open(rec, "rt").readline()
    assert first.startswith("# vllm-sentinel recording")


def test_recorded_session_yields_at_least_two_distinct_incidents(replayed):
    kinds = {i["incident"] for i in replayed["incidents"]}
    assert len(kinds) >= 2, kinds
    meta = load_metadata(default_recording())
    expected = {s["expected_incident"] for s in meta["scenarios"] if s["expected_incident"]}
    assert expected <= kinds, f"the session was made to show {sorted(expected)}; replay found {sorted(kinds)}"
    assert replayed["source"] == f"recording:{default_recording().name}"


def test_incidents_come_in_the_order_the_session_caused_them(replayed):
    meta = load_metadata(default_recording())
    starts = {}
    for inc in replayed["incidents"]:
        starts.setdefault(inc["incident"], inc["start"])
    order = [s["expected_incident"] for s in meta["scenarios"] if s["expected_incident"] in starts]
    assert [starts[k] for k in order] == sorted(starts[k] for k in order), starts


def test_fixes_are_computed_from_the_recorded_configuration(replayed):
    meta = load_metadata(default_recording())
    expected = {s["expected_incident"] for s in meta["scenarios"] if s["expected_incident"]}
    for inc in replayed["incidents"]:
        if inc["incident"] in expected:
            concrete = [f for f in inc["fixes"] if f.get("suggested")]
            assert concrete, (inc["incident"], inc["fixes"])
    kv = [f for i in replayed["incidents"] if i["incident"] == "kv_cache_pressure" for f in i["fixes"]
          if f["param"] == "--max-num-seqs"]
    assert kv and kv[0]["current"] == "4", kv  # the recorded server ran with --max-num-seqs 4


def test_replay_into_a_kept_database(tmp_path):
    db = tmp_path / "replay.duckdb"
    doc = run_replay(db=db)
    with Store.open(db, read_only=True) as store:
        n = store.cursor().execute("SELECT count(*) FROM config_snapshots").fetchone()[0]
    assert n >= 1 and doc["incidents"]


def test_missing_recording_names_the_file(tmp_path):
    with pytest.raises(ReplayError, match="not found"):
        run_replay(recording=tmp_path / "nope.prom.gz")


def test_metadata_path():
    assert metadata_path(Path("/r/x.prom.gz")) == Path("/r/x.json")
    assert metadata_path(Path("/r/x.prom")) == Path("/r/x.json")
