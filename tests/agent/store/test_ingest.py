"""`vllm-sentinel ingest`: dumps someone sends you, through the real CLI into a real DuckDB file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.exposition import parse

FIXTURES = Path(__file__).parents[2] / "collectors" / "fixtures"
NVML_DUMP = FIXTURES / "nvml" / "nvml-h200.prom.gz"
CAPTURE = FIXTURES / "vllm-0.32.0-cpu-one-request.prom.txt"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_sentinel", *args], capture_output=True, text=True, timeout=120)


def ingest_text(tmp_path: Path, name: str, text: str,
                instance: str = "a:1") -> tuple[subprocess.CompletedProcess, Path]:
    """Write a dump file `name` and ingest it through the CLI into a new store: the CLI's result and the store."""
    dump = tmp_path / name
    dump.write_text(text)
    db = tmp_path / "s.duckdb"
    return cli("ingest", str(dump), "--db", str(db), "--instance", instance), db


def query(db: Path, sql: str) -> list[tuple]:
    """The rows of `sql` over the ingested store, read-only."""
    with Store.open(db, read_only=True) as s:
        return s.con.execute(sql).fetchall()


def test_ingest_a_timestamped_gzip_dump_keeps_every_sample_at_its_time(tmp_path):
    db = tmp_path / "s.duckdb"
    res = cli("ingest", str(NVML_DUMP), "--instance", "gpu-node:8000", "--db", str(db))
    assert res.returncode == 0, res.stderr
    import gzip
    parsed = parse(gzip.open(NVML_DUMP, "rt").read())
    assert f"stored {len(parsed)} samples for gpu-node:8000" in res.stdout
    with Store.open(db, read_only=True) as s:
        n, lo, hi = s.con.execute("SELECT count(*), min(ts), max(ts) FROM samples").fetchone()
        metrics = {r[0] for r in s.con.execute("SELECT DISTINCT metric FROM series").fetchall()}
    assert n == len(parsed)
    assert (lo, hi) == (min(parsed.timestamps_ms), max(parsed.timestamps_ms))
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE"} <= metrics


def test_ingest_without_timestamps_uses_at_and_needs_an_instance(tmp_path):
    db = tmp_path / "s.duckdb"
    res = cli("ingest", str(CAPTURE), "--db", str(db))
    assert res.returncode == 1 and "--instance" in res.stderr
    res = cli("ingest", str(CAPTURE), "--db", str(db), "--instance", "a:8000", "--at", "2026-11-29T10:00:00Z")
    assert res.returncode == 0, res.stderr
    assert query(db, "SELECT DISTINCT ts FROM samples") == [(1_795_946_400_000,)]
    assert query(db, "SELECT count(*) FROM series WHERE metric LIKE '%_created'") == [(0,)]


def test_instance_label_in_the_data_wins_and_old_names_are_aliased(tmp_path):
    res, db = ingest_text(tmp_path, "old.prom",
                          'vllm:gpu_cache_usage_perc{instance="old:8000",model_name="m"} 0.5 1795946400000\n'
                          'vllm:num_requests_running{model_name="m"} 3 1795946400000\n', instance="fallback:1")
    assert res.returncode == 0, res.stderr
    rows = sorted(query(db, "SELECT instance, metric, source_metric FROM series"))
    assert rows == [("fallback:1", "vllm:num_requests_running", "vllm:num_requests_running"),
                    ("old:8000", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")]


def test_a_malformed_line_is_named_and_skipped_and_the_rest_is_stored(tmp_path):
    res, db = ingest_text(tmp_path, "bad.prom", 'a{x="1"} 1 1795946400000\nthis is not a sample\nb 2 1795946400000\n')
    assert res.returncode == 1  # not everything was stored: a script must notice
    assert "skipped 1 malformed line(s), first line 2" in res.stderr and "this is not a sample" in res.stderr
    assert "Traceback" not in res.stderr and "stored 2 samples" in res.stdout
    assert query(db, "SELECT count(*) FROM samples") == [(2,)]


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_timestamps_outside_years_1_to_9999_are_skipped_lines_not_a_traceback(tmp_path, openmetrics):
    if openmetrics:  # float seconds: 1e307 s overflows to inf once turned into ms
        bad = ["1e307", "1e400", "-1e400", "nan", "9.3e15"]
        lines = [f"m{{k=\"{i}\"}} 1 {ts}" for i, ts in enumerate(bad)] + ['m{k="ok"} 1 1795946400.5', "# EOF"]
    else:
        bad = [str(-2**63), str(2**63 - 1), "1e20", "1e400", "-1e400", "253402300800000"]
        lines = [f"m{{k=\"{i}\"}} 1 {ts}" for i, ts in enumerate(bad)] + ['m{k="ok"} 1 1795946400500']
    res, db = ingest_text(tmp_path, "stamps.txt", "\n".join(lines) + "\n")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"skipped {len(bad)} malformed line(s), first line 1: timestamp out of range" in res.stderr
    assert query(db, "SELECT ts FROM samples") == [(1_795_946_400_500,)]


def test_a_long_blank_run_inside_labels_is_skipped_in_linear_time(tmp_path):
    # 60 KB of blanks in one label list once made this take a minute (regex backtracking);
    # the parse itself is bounded by tests/collectors/test_exposition_fuzz.py, this checks the path.
    res, db = ingest_text(tmp_path, "blanks.prom", 'a{x="1"' + " " * 60_000 + ';} 1 1795946400000\nb 2 1795946400000\n')
    assert res.returncode == 1 and "first line 1: malformed labels" in res.stderr
    assert query(db, "SELECT count(*) FROM samples") == [(1,)]


def test_duplicate_label_names_are_a_skipped_line_not_a_store_failure(tmp_path):
    res, db = ingest_text(tmp_path, "dup.prom", 'vllm:num_requests_running{engine="0",engine="1"} 1 1795946400000\n'
                                                'vllm:num_requests_running{engine="0"} 2 1795946400000\n')
    assert res.returncode == 1 and "first line 1: label 'engine' given twice" in res.stderr
    assert query(db, "SELECT value FROM samples") == [(2.0,)]


def test_openmetrics_dump_with_float_second_timestamps(tmp_path):
    res, db = ingest_text(tmp_path, "om.txt", "# TYPE vllm:num_preemptions counter\n"
                          'vllm_num_preemptions_total{engine="0",model_name="m"} 4 1795946400.5\n'
                          'vllm_num_preemptions_created{engine="0",model_name="m"} 1795946000.0 1795946400.5\n'
                          "# EOF\n")
    assert res.returncode == 0, res.stderr
    assert query(db, "SELECT metric, ts, value FROM samples JOIN series USING (series_id)") == [
        ("vllm:num_preemptions_total", 1_795_946_400_500, 4.0)]
