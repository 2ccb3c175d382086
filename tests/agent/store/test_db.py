"""The DuckDB store: appends, reopen, retention, sorting, and a writer killed mid-tick."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vllm_sentinel.agent.store.db import HOUR_MS, SchemaMissing, Store, StoreCorrupt, StoreLocked
from vllm_sentinel.collectors.base import Batch, Event

T0 = 1_795_000_000_000 - (1_795_000_000_000 % HOUR_MS)  # an hour boundary


def batch(ts: int, instance: str = "a:8000", value: float | None = 1.0) -> Batch:
    b = Batch(instance=instance, ts_ms=ts)
    b.add("vllm:num_requests_running", 'engine="0",model_name="m"', value)
    b.add("vllm:prompt_tokens_total", {"model_name": "m", "engine": "0"}, 10.0 if value is None else value * 10)
    return b


def test_append_and_query_back(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        assert s.append(batch(T0)) == 2
        assert s.append(batch(T0 + 1000, value=2.0)) == 2
        rows = s.con.execute(
            f"SELECT s.metric, x.ts, x.value FROM {s.samples_sql(T0, T0 + 1000)} x JOIN series s USING (series_id) "
            "ORDER BY 1, 2").fetchall()
    assert rows == [("vllm:num_requests_running", T0, 1.0), ("vllm:num_requests_running", T0 + 1000, 2.0),
                    ("vllm:prompt_tokens_total", T0, 10.0), ("vllm:prompt_tokens_total", T0 + 1000, 20.0)]


def test_label_order_does_not_split_a_series(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        b = Batch(instance="a", ts_ms=T0)
        b.add("m", 'b="2",a="1"', 1.0)
        b.add("m", 'a="1",b="2"', 2.0, ts_ms=T0 + 1)
        s.append(b)
        assert s.con.execute("SELECT count(*), min(labels_text) FROM series").fetchone() == (1, 'a="1",b="2"')
        assert s.con.execute("SELECT labels['b'] FROM series").fetchone()[0] in ("2", ["2"])


def test_staleness_marker_is_null(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        s.append(batch(T0, value=None))
        assert s.con.execute("SELECT count(*) FROM samples WHERE value IS NULL").fetchone()[0] == 1


def test_reopen_keeps_series_ids_and_samples(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        s.append(batch(T0))
    with Store.open(path) as s:
        s.append(batch(T0 + 1000))
        assert s.con.execute("SELECT count(*) FROM series").fetchone()[0] == 2
        assert s.con.execute("SELECT count(*) FROM samples").fetchone()[0] == 4
    with Store.open(path, read_only=True) as r:
        assert r.time_range() == (T0, T0 + 1000)


def test_samples_spanning_hours_land_in_their_partitions_and_retention_drops_whole_hours(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        b = Batch(instance="a", ts_ms=T0)
        for h in range(3):
            b.add("m", "", float(h), ts_ms=T0 + h * HOUR_MS + 5)
        s.append(b)
        assert [i for i, _ in s.partitions()] == [T0 // HOUR_MS + h for h in range(3)]
        assert s.con.execute(f"SELECT count(*) FROM {s.samples_sql(T0 + HOUR_MS, T0 + HOUR_MS + 10)}").fetchone()[0] == 1
        dropped = s.drop_before(T0 + 2 * HOUR_MS)  # hours 0 and 1 have ended by then
        assert len(dropped) == 2
        assert s.con.execute("SELECT value FROM samples").fetchall() == [(2.0,)]


def test_events_are_stored_and_dropped_with_retention(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        b = batch(T0)
        b.events.append(Event(T0, "gpu0", "xid", {"xid": "79"}, "GPU has fallen off the bus"))
        s.append(b)
        assert s.con.execute("SELECT kind, message FROM events").fetchall() == [("xid", "GPU has fallen off the bus")]
        s.drop_before(T0 + HOUR_MS)
        assert s.con.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_closed_partitions_are_sorted_by_series_then_time(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        for i in range(50):
            s.append(batch(T0 + i * 1000, value=float(i)))
        assert s.sort_closed(T0 + 10_000) == []  # the hour is still open
        assert s.sort_closed(T0 + HOUR_MS + 10 * 60_000) == [f"samples_{T0 // HOUR_MS}"]
        rows = s.con.execute(f"SELECT series_id, ts FROM samples_{T0 // HOUR_MS}").fetchall()
        assert rows == sorted(rows)
        assert s.partitions() == [(T0 // HOUR_MS, True)]
        s.append(batch(T0 + 999_000))  # a late sample reopens it for sorting
        assert s.partitions() == [(T0 // HOUR_MS, False)]


def test_second_writer_gets_a_clear_lock_error(tmp_path):
    path = tmp_path / "s.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time, duckdb
        con = duckdb.connect({str(path)!r})
        print('ready', flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLocked, match=r"held by another process \(PID \d+\)"):
            Store.open(path, read_only=True)
    finally:
        holder.kill()
        holder.wait()


def test_corrupt_file_is_reported_and_left_alone(tmp_path):
    path = tmp_path / "s.duckdb"
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    with pytest.raises(StoreCorrupt, match="Move the file aside"):
        Store.open(path)
    assert path.read_bytes() == before


def test_read_only_open_of_a_foreign_database_is_refused(tmp_path):
    import duckdb
    path = tmp_path / "other.duckdb"
    duckdb.connect(str(path)).execute("CREATE TABLE t (x INT)").close()
    with pytest.raises(SchemaMissing, match="not a vllm-sentinel database"):
        Store.open(path, read_only=True)


def test_writes_on_a_read_only_store_are_refused(tmp_path):
    path = tmp_path / "s.duckdb"
    Store.open(path).close()
    with Store.open(path, read_only=True) as r, pytest.raises(Exception, match="read-only"):
        r.append(batch(T0))


def test_migrations_are_recorded(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        versions = [r[0] for r in s.con.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()]
    assert versions[0] == 1 and versions == sorted(set(versions))


WRITER = """
import sys, time
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch
s = Store.open(sys.argv[1])
t0 = int(sys.argv[2])
for tick in range(100000):
    b = Batch(instance="a", ts_ms=t0 + tick * 1000)
    for i in range(2000):
        b.add("m", f'i="{i}"', float(tick))
    s.append(b)
    print(tick, flush=True)
"""


def test_kill_9_mid_tick_keeps_every_committed_tick(tmp_path):
    path = tmp_path / "s.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(T0)], stdout=subprocess.PIPE, text=True)
    committed = -1
    deadline = time.monotonic() + 60
    while committed < 5 and time.monotonic() < deadline:
        committed = int(proc.stdout.readline())
    time.sleep(0.013)  # land the kill somewhere inside a later tick's transaction
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for line in proc.stdout:  # ticks printed after our last read were committed too
        committed = int(line)
    with Store.open(path, read_only=True) as r:
        ticks, rows = r.con.execute("SELECT count(DISTINCT ts), count(*) FROM samples").fetchone()
    assert ticks >= committed + 1
    assert rows == ticks * 2000  # no half-written tick
