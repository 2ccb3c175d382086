"""kill -9 inside the store's maintenance: the hourly rewrite to a Parquet archive, and retention.

A child process writes three closed hours, then runs the rewrite or the retention and is held at a
named point inside it (VLLM_SENTINEL_TEST_STALL_AT); the test kills it there with SIGKILL. Reopened,
the file holds every committed sample exactly once, its partitions table matches its tables and
archive files, a file no partition names is gone after the next read-write open, and the
interrupted work runs to the end at the next try.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from vllm_sentinel.agent.store.db import HOUR_MS, Store
from vllm_sentinel.collectors.base import Batch

HOUR0 = 498_874  # an hour index in 2026
SERIES = 300
TICKS_PER_HOUR = 20

CHILD = r"""
import sys
from vllm_sentinel.agent.store.db import Store
path, work, now_ms, cutoff_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = Store.open(path)
print("ready", flush=True)
s.sort_closed(now_ms) if work == "rewrite" else s.drop_before(cutoff_ms)
print("finished", flush=True)
"""


def write_hours(path) -> int:
    """Three closed hours of samples; returns how many were written."""
    with Store.open(path) as s:
        for h in range(3):
            for t in range(TICKS_PER_HOUR):
                b = Batch(instance="a", ts_ms=(HOUR0 + h) * HOUR_MS + t * 180_000)
                for i in range(SERIES):
                    b.add("m", f'i="{i}"', float(h * 1000 + t))
                s.append(b)
    return 3 * TICKS_PER_HOUR * SERIES


def kill_at(path, work: str, point: str) -> None:
    """Run `work` in a child held at `point`, then SIGKILL it there."""
    now_ms = (HOUR0 + 4) * HOUR_MS
    cutoff_ms = (HOUR0 + 2) * HOUR_MS  # drops the first two hours
    env = dict(os.environ, VLLM_SENTINEL_TEST_STALL_AT=point)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), work, str(now_ms), str(cutoff_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    line = ""
    while f"stalled at {point}" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"never reached {point}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def consistent(path) -> dict[int, tuple[int, bool]]:
    """idx -> (rows, sorted) after checking every listed partition is a table, every archive it names is
    there, and none is left over."""
    with Store.open(path, read_only=True) as s:
        listed = {i: (bool(srt), a) for i, srt, a in s.con.execute(
            "SELECT idx, sorted, archive FROM partitions").fetchall()}
        tables = {r[0] for r in s.con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE 'samples_%'").fetchall()}
        assert tables == {f"samples_{i}" for i in listed}, (tables, listed)  # no half-renamed copy
        assert s.missing_archives == []
        out = {}
        for idx, (is_sorted, _) in listed.items():
            rows, distinct = s.con.execute("SELECT count(*), count(DISTINCT (series_id, ts)) FROM "
                                           f"{s.samples_sql(idx * HOUR_MS, (idx + 1) * HOUR_MS - 1)}").fetchone()
            assert rows == distinct  # nothing doubled
            out[idx] = (rows, is_sorted)
        total = s.con.execute("SELECT count(*) FROM samples").fetchone()[0]
        assert total == sum(r for r, _ in out.values())
    return out


def archive_files(path) -> set[str]:
    folder = path.parent / (path.name + ".hours")
    return {f.name for f in folder.iterdir()} if folder.is_dir() else set()


def archived(path_or_store) -> set[str]:
    """Archive files the partitions table names."""
    if isinstance(path_or_store, Store):
        return {r[0] for r in path_or_store.con.execute(
            "SELECT archive FROM partitions WHERE archive IS NOT NULL").fetchall()}
    with Store.open(path_or_store, read_only=True) as s:
        return archived(s)


HOUR_ROWS = TICKS_PER_HOUR * SERIES


@pytest.mark.parametrize("point", ["rewrite:sorted_copy", "rewrite:before_commit", "rewrite:before_checkpoint"])
def test_kill_9_inside_the_hourly_rewrite_loses_nothing_and_the_rewrite_finishes_later(tmp_path, point):
    path = tmp_path / "s.duckdb"
    write_hours(path)
    kill_at(path, "rewrite", point)
    after = consistent(path)
    assert {i: r for i, (r, _) in after.items()} == {HOUR0 + h: HOUR_ROWS for h in range(3)}
    # a rewrite that committed stays done; one that did not is done again now
    if point != "rewrite:before_checkpoint":
        assert not after[HOUR0][1]
    with Store.open(path) as s:
        assert archive_files(path) == archived(s)  # a file written but never committed is swept at open
        s.sort_closed((HOUR0 + 4) * HOUR_MS)
    again = consistent(path)
    assert again == {HOUR0 + h: (HOUR_ROWS, True) for h in range(3)}
    assert archive_files(path) == archived(path) and len(archived(path)) == 3
    with Store.open(path, read_only=True) as s:  # sorted means sorted, in a file that holds the whole hour
        assert s.con.execute(f"SELECT count(*) FROM samples_{HOUR0}").fetchone()[0] == 0
        folder = path.parent / (path.name + ".hours")
        name = s.con.execute("SELECT archive FROM partitions WHERE idx = ?", [HOUR0]).fetchone()[0]
        ts = [r[0] for r in s.con.execute(
            f"SELECT series_id * 1e13 + ts FROM read_parquet('{folder / name}')").fetchall()]
        assert len(ts) == HOUR_ROWS and ts == sorted(ts)


@pytest.mark.parametrize("archived_first", [False, True])
def test_kill_9_inside_retention_drops_all_of_it_or_none_and_finishes_later(tmp_path, archived_first):
    path = tmp_path / "s.duckdb"
    write_hours(path)
    if archived_first:
        with Store.open(path) as s:
            s.sort_closed((HOUR0 + 4) * HOUR_MS)
    kill_at(path, "retention", "retention:before_commit")
    assert {i: r for i, (r, _) in consistent(path).items()} == {HOUR0 + h: HOUR_ROWS for h in range(3)}
    with Store.open(path) as s:
        dropped = s.drop_before((HOUR0 + 2) * HOUR_MS)
    assert dropped == [f"samples_{HOUR0}", f"samples_{HOUR0 + 1}"]
    assert {i: r for i, (r, _) in consistent(path).items()} == {HOUR0 + 2: HOUR_ROWS}
    assert archive_files(path) == archived(path) and len(archived(path)) == int(archived_first)


def test_kill_9_after_retention_committed_leaves_files_that_the_next_open_removes(tmp_path):
    path = tmp_path / "s.duckdb"
    write_hours(path)
    with Store.open(path) as s:
        s.sort_closed((HOUR0 + 4) * HOUR_MS)
    kill_at(path, "retention", "retention:before_unlink")
    assert {i: r for i, (r, _) in consistent(path).items()} == {HOUR0 + 2: HOUR_ROWS}
    assert len(archive_files(path)) == 3 and len(archived(path)) == 1  # two files outlived their partitions
    with Store.open(path):
        pass
    assert archive_files(path) == archived(path)
