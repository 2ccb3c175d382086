"""The DuckDB store: appends, reopen, retention, sorting, and a writer killed mid-tick."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vllm_sentinel.agent.store.db import HOUR_MS, SchemaMissing, Store, StoreCorrupt, StoreError, StoreLocked
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


def test_nan_inf_and_staleness_markers_keep_their_meaning_across_hours_and_both_write_paths(tmp_path):
    """A NaN sample stays NaN and a staleness marker (None) stays NULL, beside plain values, in a tick that
    spans two hours and in the columnar path: numpy columns, which DuckDB would read NaN from as NULL."""
    import math
    import numpy as np
    with Store.open(tmp_path / "s.duckdb") as s:
        b = Batch(instance="a", ts_ms=T0)
        values = [1.0, math.nan, None, math.inf, -0.0, None, math.nan]
        for i, v in enumerate(values):
            b.add("m", f'k="{i}"', v, ts_ms=T0 + (HOUR_MS if i % 2 else 0) + i)
        assert s.append(b) == len(values)
        s.append_columns([("c", "m", "", "m")], np.zeros(3, dtype=np.int64),
                         np.array([T0, T0 + 1, T0 + HOUR_MS], dtype=np.int64), np.array([math.nan, 2.0, -math.inf]))
        rows = s.con.execute("SELECT s.instance, s.labels_text, x.ts, x.value, x.value IS NULL FROM samples x "
                             "JOIN series s USING (series_id) ORDER BY 1, 3").fetchall()
    got = [(inst, ts, "NULL" if null else repr(v)) for inst, _, ts, v, null in rows]
    want = [("a", T0 + i + (HOUR_MS if i % 2 else 0), "NULL" if v is None else repr(v)) for i, v in enumerate(values)]
    want += [("c", T0, "nan"), ("c", T0 + 1, "2.0"), ("c", T0 + HOUR_MS, "-inf")]
    assert sorted(got) == sorted(want)


def test_the_write_path_does_not_load_pyarrow(tmp_path):
    """The daemon's ticks and new series go to DuckDB as numpy columns: pyarrow's 30 MiB stay out of its memory."""
    code = textwrap.dedent(f"""
        import sys
        from vllm_sentinel.agent.store.db import Store
        from vllm_sentinel.collectors.base import Batch
        with Store.open({str(tmp_path / "s.duckdb")!r}) as s:
            b = Batch(instance="a", ts_ms={T0})
            b.add("m", 'x="1"', 1.0)
            b.add("m", 'x="2"', None)
            s.append_many([b])
            assert s.con.execute("SELECT count(*) FROM samples").fetchone()[0] == 2
        print(sorted(m for m in ("pyarrow", "pandas") if m in sys.modules))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


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


def hour_rows(s: Store, idx: int) -> list[tuple]:
    """(series_id, ts, value) of one hour in the order the store hands them out, table and archive both."""
    return s.con.execute(f"SELECT series_id, ts, value FROM {s.samples_sql(idx * HOUR_MS, (idx + 1) * HOUR_MS - 1)}"
                         ).fetchall()


def archive_of(s: Store, idx: int):
    name = s.con.execute("SELECT archive FROM partitions WHERE idx = ?", [idx]).fetchone()[0]
    return None if name is None else s.archive_folder / name


def test_closed_hours_go_to_a_sorted_parquet_file_and_late_samples_are_merged_in(tmp_path):
    idx = T0 // HOUR_MS
    with Store.open(tmp_path / "s.duckdb") as s:
        for i in range(50):
            s.append(batch(T0 + i * 1000, value=float(i)))
        before = sorted(hour_rows(s, idx))
        assert s.sort_closed(T0 + 10_000) == []  # the hour is still open
        assert s.sort_closed(T0 + HOUR_MS + 10 * 60_000) == [f"samples_{idx}"]
        assert s.partitions() == [(idx, True)]
        first = archive_of(s, idx)
        assert first.parent == tmp_path / "s.duckdb.hours" and first.is_file()
        assert s.con.execute(f"SELECT count(*) FROM samples_{idx}").fetchone()[0] == 0  # the table gave it all up
        in_file = s.con.execute(f"SELECT series_id, ts, value FROM read_parquet('{first}')").fetchall()
        assert in_file == before  # every sample, sorted by (series_id, ts)

        s.append(batch(T0 + 999_000, value=7.0))  # a late sample reopens the hour
        assert s.partitions() == [(idx, False)]
        assert len(hour_rows(s, idx)) == 102 and set(before) < set(hour_rows(s, idx))
        assert s.sort_closed(T0 + HOUR_MS + 20 * 60_000) == [f"samples_{idx}"]
        second = archive_of(s, idx)
        assert second != first and not first.exists()  # merged into a new file, the old one removed
        merged = s.con.execute(f"SELECT series_id, ts, value FROM read_parquet('{second}')").fetchall()
        assert len(merged) == 102 and merged == sorted(merged)
    with Store.open(tmp_path / "s.duckdb", read_only=True) as r:  # a reader without the daemon reads the archive
        assert r.con.execute("SELECT count(*) FROM samples").fetchone()[0] == 102
        assert r.time_range() == (T0, T0 + 999_000)


def test_an_in_memory_store_sorts_its_closed_hours_in_place():
    idx = T0 // HOUR_MS
    with Store.open(":memory:") as s:
        for i in range(20):
            s.append(batch(T0 + (20 - i) * 1000, value=float(i)))
        assert s.sort_closed(T0 + 2 * HOUR_MS) == [f"samples_{idx}"]
        rows = s.con.execute(f"SELECT series_id, ts FROM samples_{idx}").fetchall()
        assert len(rows) == 40 and rows == sorted(rows)
        assert s.archive_folder is None


def test_a_missing_archive_file_is_named_and_the_other_hours_still_read(tmp_path, caplog):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        s.append(batch(T0))
        s.append(batch(T0 + HOUR_MS))
        s.sort_closed(T0 + 3 * HOUR_MS)
        lost = archive_of(s, T0 // HOUR_MS)
    lost.unlink()
    with Store.open(path, read_only=True) as r:
        assert r.missing_archives == [lost.name]
        assert r.con.execute(f"SELECT min(ts), count(*) FROM {r.samples_sql(T0, T0 + 2 * HOUR_MS)}").fetchone() == (
            T0 + HOUR_MS, 2)
    with Store.open(path) as w:  # a read-write open also mends the ad-hoc view
        assert w.missing_archives == [lost.name]
        assert w.con.execute("SELECT min(ts), count(*) FROM samples").fetchone() == (T0 + HOUR_MS, 2)
    assert f"the archive file {lost.name} of hour {T0 // HOUR_MS} is missing" in caplog.text
    assert "Restore it into" in caplog.text


def test_a_store_path_with_a_quote_archives_and_reads(tmp_path):
    path = tmp_path / "it's here" / "s.duckdb"
    with Store.open(path) as s:
        s.append(batch(T0))
        assert s.sort_closed(T0 + 2 * HOUR_MS) == [f"samples_{T0 // HOUR_MS}"]
        assert s.con.execute("SELECT count(*) FROM samples").fetchone()[0] == 2


def test_a_memory_limit_that_is_not_a_size_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(StoreError, match="not a size such as 256MB"):
        Store.open(tmp_path / "s.duckdb", memory_limit="1GB'; DROP TABLE series; --")
    assert not (tmp_path / "s.duckdb").exists()
    with Store.open(tmp_path / "s.duckdb", memory_limit="300MB") as s:
        assert s.con.execute("SELECT current_setting('memory_limit')").fetchone()[0] in ("286.1 MiB", "300.0 MB")


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


def test_a_store_opened_for_the_daemon_bounds_duckdbs_threads(tmp_path):
    from vllm_sentinel.agent.daemon.wiring import STORE_THREADS

    with Store.open(tmp_path / "s.duckdb", threads=STORE_THREADS) as store:
        assert store.cursor().execute("SELECT current_setting('threads')").fetchone()[0] == STORE_THREADS
        # and its I/O threads: by default 4 per core, 65 threads in the daemon on the H200's 16-core host
        assert store.cursor().execute("SELECT current_setting('async_threads')").fetchone()[0] == STORE_THREADS
