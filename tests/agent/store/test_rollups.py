"""Five-minute rollups: long-window range functions read them and answer as the raw samples do."""

from __future__ import annotations

import math
import random
import time

import pytest

from vllm_sentinel.agent.diagnosis.diagnose import diagnose
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store import rollups
from vllm_sentinel.agent.store.db import HOUR_MS, Store
from vllm_sentinel.collectors.base import Batch

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, on the hour
EXACT = ["rate(c_total[{w}])", "increase(c_total[{w}])", "delta(g[{w}])", "count_over_time(g[{w}])",
         "max_over_time(g[{w}])", "min_over_time(g[{w}])", "last_over_time(g[{w}])", "present_over_time(g[{w}])",
         "sum by (k) (increase(c_total[{w}]))", "count_over_time(c_total[{w}])"]
ROUNDED = ["sum_over_time(g[{w}])", "avg_over_time(g[{w}])", "increase(g[{w}])"]  # increase: a gauge drops often


def _fill(store: Store, rng: random.Random, hours: float, t0: int = T0, series: int = 4,
          aligned: bool = False) -> None:
    """Counters with resets, gauges with NaNs, stale markers, gaps, jittered scrapes every 1-20 s
    (aligned: exactly every 15 s from t0, as an ingested dump often is, so samples fall on block boundaries)."""
    counters = [0.0] * series
    t = t0
    while t < t0 + hours * HOUR_MS:
        t += 15_000 if aligned else rng.choice([1000, 5000, 15_000, 20_000]) + rng.randint(-300, 300)
        if rng.random() < 0.002:
            t += rng.randint(60_000, 900_000)  # the target was down
        b = Batch(instance="a:1", ts_ms=t)
        b.metrics, b.labels, b.values, b.timestamps_ms = ["up"], [""], [1.0], [None]
        for i in range(series):
            counters[i] = 0.0 if rng.random() < 0.003 else counters[i] + rng.choice([0.0, 1.0, 2.5, 1e6 + 0.1])
            gauge = math.nan if rng.random() < 0.01 else rng.uniform(-50, 50)
            stale = rng.random() < 0.002
            b.metrics += ["c_total", "g"]
            b.labels += [f'k="{i % 2}",i="{i}"'] * 2
            b.values += [None if stale else counters[i], None if stale else gauge]
            b.timestamps_ms += [None, None]
        store.append(b)


def _answers(engine: Engine, expr: str, t: int) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in engine.instant(expr, t)}


def _equal(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_windows_from_rollups_equal_the_raw_samples(seed):
    rng = random.Random(seed)
    store = Store.open(":memory:")
    _fill(store, rng, hours=4)
    assert store.roll_up(T0 + 4 * HOUR_MS, max_blocks=1000) > 0
    raw, rolled = Engine(store), Engine(store, rollups=True)
    compared = 0
    for _ in range(25):
        w = rng.choice(["30m", "47m", "1h", "2h", "3h13m"])
        t = T0 + rng.randint(2 * HOUR_MS, 4 * HOUR_MS + 600_000)
        t = rng.choice([t, t // rollups.BLOCK_MS * rollups.BLOCK_MS, t // rollups.BLOCK_MS * rollups.BLOCK_MS - 1])
        for form in EXACT:
            expr = form.format(w=w)
            want, got = _answers(raw, expr, t), _answers(rolled, expr, t)
            assert want.keys() == got.keys(), expr
            for k in want:
                assert _equal(want[k], got[k]), (expr, t - T0, k, want[k], got[k])
                compared += 1
        for form in ROUNDED:
            expr = form.format(w=w)
            want, got = _answers(raw, expr, t), _answers(rolled, expr, t)
            assert want.keys() == got.keys(), expr
            for k in want:
                assert _equal(want[k], got[k]) or math.isclose(want[k], got[k], rel_tol=1e-9, abs_tol=1e-9), expr
    assert compared > 500 and rolled.rollups_used


@pytest.mark.parametrize("aligned", [False, True])
def test_range_queries_over_whole_blocks_equal_the_raw_samples(aligned):
    rng = random.Random(7)
    store = Store.open(":memory:")
    _fill(store, rng, hours=3, aligned=aligned)
    store.roll_up(T0 + 3 * HOUR_MS, max_blocks=1000)
    raw, rolled = Engine(store), Engine(store, rollups=True)
    for expr in ("rate(c_total[35m])", "max_over_time(g[35m])", "count_over_time(g[1h])", "increase(c_total[10m])",
                 "last_over_time(g[15m])", "min_over_time(g[20m])"):
        want = raw.range(expr, T0 + HOUR_MS, T0 + 3 * HOUR_MS, 35 * 60_000)
        got = rolled.range(expr, T0 + HOUR_MS, T0 + 3 * HOUR_MS, 35 * 60_000)
        assert [(s.labels, [(t, repr(v)) for t, v in s.points]) for s in want] == \
               [(s.labels, [(t, repr(v)) for t, v in s.points]) for s in got], expr
    assert rolled.rollups_used


def test_short_windows_and_unrolled_time_read_samples():
    store = Store.open(":memory:")
    _fill(store, random.Random(3), hours=2)
    engine = Engine(store, rollups=True)
    engine.instant("rate(c_total[1h])", T0 + 2 * HOUR_MS)
    assert not engine.rollups_used  # nothing rolled yet
    store.roll_up(T0 + 2 * HOUR_MS + rollups.ROLL_DELAY_MS, max_blocks=1000)
    engine.instant("rate(c_total[5m])", T0 + 2 * HOUR_MS)
    assert not engine.rollups_used  # a short window reads its few samples
    engine.instant("rate(c_total[1h])", T0 + 2 * HOUR_MS)
    assert engine.rollups_used


def test_a_late_write_into_a_rolled_block_is_seen():
    store = Store.open(":memory:")
    _fill(store, random.Random(4), hours=2)
    store.roll_up(T0 + 2 * HOUR_MS + rollups.ROLL_DELAY_MS, max_blocks=1000)
    at = T0 + HOUR_MS + 123_456
    assert store._rolled_until > at
    before = _answers(Engine(store, rollups=True), "count_over_time(g[1h])", T0 + 2 * HOUR_MS)
    late = Batch(instance="a:1", ts_ms=at)
    late.metrics, late.labels, late.values, late.timestamps_ms = ["g"], ['k="0",i="0"'], [1.0], [None]
    store.append(late)
    assert store._rolled_until <= at  # the blocks from the late sample on were taken back
    after = _answers(Engine(store, rollups=True), "count_over_time(g[1h])", T0 + 2 * HOUR_MS)
    raw = _answers(Engine(store), "count_over_time(g[1h])", T0 + 2 * HOUR_MS)
    key = (("i", "0"), ("instance", "a:1"), ("k", "0"))
    assert after == raw and after[key] == before[key] + 1
    store.roll_up(T0 + 2 * HOUR_MS + rollups.ROLL_DELAY_MS, max_blocks=1000)  # rolled again, with it
    engine = Engine(store, rollups=True)
    assert _answers(engine, "count_over_time(g[1h])", T0 + 2 * HOUR_MS) == raw and engine.rollups_used


def test_rollups_survive_the_hourly_archive_and_go_with_retention(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    _fill(store, random.Random(5), hours=3)
    store.sort_closed(T0 + 4 * HOUR_MS)  # closed hours become Parquet files
    assert store.roll_up(T0 + 3 * HOUR_MS + rollups.ROLL_DELAY_MS, max_blocks=5) == 5  # a round at a time
    store.roll_up(T0 + 3 * HOUR_MS + rollups.ROLL_DELAY_MS, max_blocks=1000)
    expr, t = "increase(c_total[2h])", T0 + 3 * HOUR_MS - 1
    assert _answers(Engine(store, rollups=True), expr, t) == _answers(Engine(store), expr, t)
    store.close()
    store = Store.open(tmp_path / "s.duckdb", read_only=True)  # the watermark is read back
    engine = Engine(store, rollups=True)
    assert _answers(engine, expr, t) == _answers(Engine(store), expr, t) and engine.rollups_used
    store.close()
    store = Store.open(tmp_path / "s.duckdb")
    store.drop_before(T0 + HOUR_MS)
    first = store.cursor().execute("SELECT min(block) FROM rollups").fetchone()[0]
    assert first * rollups.BLOCK_MS >= T0 + HOUR_MS
    store.close()


def test_diagnose_says_when_its_summary_read_rollups():
    store = Store.open(":memory:")
    _fill(store, random.Random(6), hours=3)
    start, end = T0 + 10 * 60_000, T0 + 3 * HOUR_MS
    assert diagnose(store, start, end)["summary_source"] == "samples"
    plain = diagnose(store, start, end)["summary"]
    store.roll_up(end + rollups.ROLL_DELAY_MS, max_blocks=1000)
    doc = diagnose(store, start, end)
    assert doc["summary_source"] == "rollups"
    # the summary's counters and peaks are those of the samples
    for key in ("scrapes", "scrapes_ok"):
        assert doc["summary"][0]["signals"][key] == plain[0]["signals"][key]


def test_the_daemons_maintenance_rolls_up_what_it_stored():
    from vllm_sentinel.agent.daemon.sidecar import Sidecar, SidecarConfig
    from vllm_sentinel.collectors.base import now_ms

    store = Store.open(":memory:")
    start = (now_ms() - 2 * HOUR_MS) // HOUR_MS * HOUR_MS
    _fill(store, random.Random(8), hours=1, t0=start, series=1)
    sidecar = Sidecar(store, [], SidecarConfig(metrics_port=None, socket_path=None))
    sidecar.start()
    try:
        for _ in range(100):  # maintenance runs as the writer starts; the host may be slow to schedule it
            if store._rolled_until:
                break
            time.sleep(0.1)
    finally:
        sidecar.stop()
    # a round of maintenance rolls a few blocks, from the oldest sample on: catching up never takes a core
    assert store._rolled_until == start + rollups.BLOCKS_PER_ROUND * rollups.BLOCK_MS
    assert store.cursor().execute("SELECT count(*) FROM rollups").fetchone()[0] > 0


def test_ingest_rolls_up_the_dump_it_loaded():
    from vllm_sentinel.agent.store.ingest import ingest_text

    lines = []
    for k in range(0, 3600, 15):
        t = T0 + k * 1000
        lines.append(f'vllm:request_success_total{{instance="a:1"}} {k // 15} {t}\n')
        lines.append(f'up{{instance="a:1"}} 1 {t}\n')
    store = Store.open(":memory:")
    ingest_text(store, "".join(lines), None, T0)
    assert store._rolled_until == T0 + HOUR_MS - rollups.BLOCK_MS  # the last block is not complete
    doc = diagnose(store, T0, T0 + HOUR_MS)
    assert doc["summary_source"] == "rollups"
    assert doc["summary"][0]["signals"]["requests_finished"] == pytest.approx(239 * 3600 / (3600 - 15), rel=0.01)
