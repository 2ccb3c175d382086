"""Kept window reads: every answer is window_sql.window_samples' own, whatever came before it."""

from __future__ import annotations

import random

import numpy as np

from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.read_memo import WindowReads
from vllm_sentinel.agent.store import window_sql
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch

HOUR_MS = 3_600_000
T0 = 1_796_464_800_000  # an hour's start


def _fill(path) -> None:
    rng = random.Random(5)
    with Store.open(path) as store:
        for tick in range(0, 2 * 3600, 15):  # two hours at 15 s: two partitions, the first one closed
            b = Batch(instance="a:8000", ts_ms=T0 + tick * 1000)
            for s in range(6):
                v = None if rng.random() < 0.05 else float(rng.randint(0, 9))  # staleness markers among values
                if s != 5 or tick < 3600:  # series 5 ends with the first hour
                    b.add("vllm:num_requests_waiting", {"engine": str(s)}, v)
            store.append_many([b])
        store.sort_closed(T0 + 2 * HOUR_MS - 1)


def test_kept_reads_answer_as_window_samples_for_any_order_of_windows(tmp_path):
    _fill(tmp_path / "s.duckdb")
    rng = random.Random(11)
    with Store.open(tmp_path / "s.duckdb", read_only=True) as store:
        reads = WindowReads(keep_samples=3_000)  # small: eviction happens too
        cur = store.cursor()
        all_sids = [r[0] for r in cur.execute("SELECT series_id FROM series ORDER BY 1").fetchall()]
        groups = [all_sids, all_sids[::-1][:3], all_sids[4:], [all_sids[2]]]  # a selector's series, in any order
        for _ in range(300):
            sids = rng.choice(groups)
            hi = T0 + rng.choice([HOUR_MS, 2 * HOUR_MS - 1, 90 * 60_000])
            lo = hi - rng.choice([60_000, 300_000, 600_000, HOUR_MS, 0])
            keep_stale = rng.random() < 0.3
            got = reads.samples(cur, store, sids, lo, hi, keep_stale)
            want = window_sql.window_samples(cur, store.samples_sql(lo, hi), sids, lo, hi, keep_stale)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8))
            got[2][:], got[3][:] = -1.0, 0  # what a caller does with its answer never reaches a later one
        assert reads.cut > 50 and reads.reads > 50
        assert reads._held <= reads.keep_samples


def test_a_read_only_engine_answers_range_queries_as_one_without_kept_reads(tmp_path):
    _fill(tmp_path / "s.duckdb")
    exprs = ["rate(vllm:num_requests_waiting[5m])", "avg_over_time(vllm:num_requests_waiting[1m])",
             "max_over_time(vllm:num_requests_waiting[10m])", "sum(increase(vllm:num_requests_waiting[2m]))"]
    with Store.open(tmp_path / "s.duckdb", read_only=True) as store:
        kept, plain = Engine(store), Engine(store)
        plain._reads = None
        assert kept._reads is not None
        for expr in exprs * 2:
            a = kept.range(expr, T0 + 600_000, T0 + 2 * HOUR_MS - 1, 5_000)
            b = plain.range(expr, T0 + 600_000, T0 + 2 * HOUR_MS - 1, 5_000)
            assert [(s.labels, s.points) for s in a] == [(s.labels, s.points) for s in b]
        assert kept._reads.cut >= len(exprs)
