"""The live engine's kept windows answer exactly as reading the store whole, whatever was written meanwhile."""

from __future__ import annotations

import numpy as np

from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.window_cache import WindowCache
from vllm_sentinel.agent.store import window_sql
from vllm_sentinel.agent.store.db import HOUR_MS, Store
from vllm_sentinel.agent.store.write_log import EVERYTHING, WriteLog
from vllm_sentinel.collectors.base import Batch

T0 = 1_795_000_000_000 // HOUR_MS * HOUR_MS + HOUR_MS - 90_000  # the hour turns during the test


def _tick(store: Store, t_ms: int, n: int = 3, scale: float = 1.0, stale: int | None = None) -> None:
    for i in range(n):
        b = Batch(instance=f"10.0.0.{i}:8000", ts_ms=t_ms)
        b.add("vllm:request_success_total", {"engine": "0"}, scale * (t_ms - T0) / 1000 * (i + 1))
        # instance `stale` failed its scrape: a staleness marker (NULL) instead of a value
        b.add("vllm:num_requests_running", {"engine": "0"}, None if i == stale else float((t_ms // 1000 + i) % 5))
        store.append(b)


def _same(a: tuple, b: tuple) -> None:
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_topped_up_windows_equal_a_whole_read_with_late_and_dropped_samples(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    cache = WindowCache()
    sids = list(range(store.series_count or 0))
    for step in range(40):
        t = T0 + step * 1000
        _tick(store, t)
        if step == 25:  # a late scrape lands after the window passed its time
            b = Batch(instance="10.0.0.0:8000", ts_ms=t - 7_500)
            b.add("vllm:num_requests_running", {"engine": "0"}, 42.0)
            store.append(b)
        if step == 33:
            store.sort_closed(t + 3 * HOUR_MS)  # same rows, another order
        sids = list(range(store.series_count))
        lo, hi = t - 30_000, t
        got = cache.samples(store.cursor(), store, sids, lo, hi)
        _same(got, window_sql.window_samples(store.cursor(), store.samples_sql(lo, hi), sids, lo, hi))
        part = sids[1::2]  # another selector over part of the series, same span
        got = cache.samples(store.cursor(), store, part, lo, hi)
        _same(got, window_sql.window_samples(store.cursor(), store.samples_sql(lo, hi), part, lo, hi))
    assert 42.0 in got[2] or 42.0 in cache.samples(store.cursor(), store, sids, lo, hi)[2]


def test_kept_instant_lookups_equal_the_sql_lookup_across_staleness_markers(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    cache = WindowCache()
    for step in range(30):
        t = T0 + step * 1000
        _tick(store, t, stale=1 if 10 <= step < 14 else None)
        sids = list(range(store.series_count))
        for offset in (0, 3_000):
            ref = np.array([t - offset], dtype=np.int64)
            got = cache.instant_lookup(store.cursor(), store, sids, ref, 5_000, offset)
            want = window_sql.instant_lookup(store.cursor(), store.samples_sql(t - offset - 5_000, t), sids, ref,
                                             5_000)
            rows = sorted(zip(*(np.asarray(got[c]).tolist() for c in ("step", "series_id", "value", "ts"))))
            assert rows == sorted(zip(*(np.asarray(want[c]).tolist() for c in ("step", "series_id", "value", "ts"))))
            if offset == 0 and 10 <= step < 14:  # the marker hides the failed instance's running requests
                assert len(rows) == len(sids) - 1


def test_incremental_engine_answers_as_a_fresh_one(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    live = Engine(store, incremental=True)
    queries = ["sum by (instance) (rate(vllm:request_success_total[20s]))",
               "max_over_time(vllm:num_requests_running[10s]) > 2",
               "increase(vllm:request_success_total[20s]) and on (instance) vllm:num_requests_running > 1",
               "vllm:num_requests_running offset 4s",
               # the same series and span at two offsets: two kept windows, not one read again each time
               "avg_over_time(vllm:num_requests_running[10s]) - avg_over_time(vllm:num_requests_running[10s] offset 3s)"]
    for step in range(45):
        t = T0 + step * 1000
        # counters reset at 30 s; instance 2's scrapes fail from 18 to 21 s
        _tick(store, t, scale=0.5 if step >= 30 else 1.0, stale=2 if 18 <= step < 22 else None)
        if step % 3 == 0 or 18 <= step < 24:
            for q in queries:
                assert live.instant(q, t) == Engine(store).instant(q, t), (q, step)


def test_write_log_oldest_since():
    log = WriteLog(keep=3)
    log.note(5000)
    m = log.mark()
    assert log.oldest_since(m) is None
    log.note(7000)
    log.note(6000)
    assert log.oldest_since(m) == 6000
    log.note(EVERYTHING)
    assert log.oldest_since(m) == EVERYTHING
    log.note(9000)  # the log no longer reaches back to m
    assert log.oldest_since(m) == EVERYTHING
    assert log.oldest_since(log.mark() - 1) == 9000


def test_windows_at_two_offsets_are_both_kept(tmp_path, monkeypatch):
    store = Store.open(tmp_path / "s.duckdb")
    live = Engine(store, incremental=True)
    # the same series and span now and a minute back, evaluated every 5 s as the daemon does
    query = "avg_over_time(vllm:num_requests_running[10s]) - avg_over_time(vllm:num_requests_running[10s] offset 1m)"
    whole_reads = []
    read = window_sql.window_samples
    monkeypatch.setattr(window_sql, "window_samples", lambda *a, **k: whole_reads.append(a[3:5]) or read(*a, **k))
    answers = {}
    for step in range(100):
        t = T0 + step * 1000
        _tick(store, t)
        if step >= 70 and step % 5 == 0:
            answers[t] = live.instant(query, t)
    assert len(whole_reads) == 2  # each window read whole once, then only topped up
    monkeypatch.undo()
    assert all(answer == Engine(store).instant(query, t) for t, answer in answers.items())
