"""PromQL engine semantics over a real in-memory store; expected numbers are promtool 2.42's answers."""

from __future__ import annotations

import math

import pytest

from vllm_sentinel.agent.promql.engine import Engine, PromQLError, Sample, Series, Unsupported
from vllm_sentinel.agent.promql.notation import STALE, expand_series_values, load_input_series
from vllm_sentinel.agent.store.db import Store


def _engine(series: dict[str, str], interval_s: int = 15) -> Engine:
    store = Store.open(":memory:")
    load_input_series(store, [{"series": k, "values": v} for k, v in series.items()], interval_s * 1000)
    return Engine(store)


def _values(result: list[Sample]) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for s in result}


def test_notation_expands_like_promtool():
    assert expand_series_values("0+5x3 _ stale 1x2 4-1x2 _x2") == [
        0.0, 5.0, 10.0, 15.0, None, STALE, 1.0, 1.0, 1.0, 4.0, 3.0, 2.0, None, None]
    with pytest.raises(PromQLError, match="bad series value"):
        expand_series_values("1 two")


def test_labels_include_instance_and_name_and_all_matcher_kinds():
    e = _engine({'m{instance="a:8000",engine="0"}': "1x10", 'm{instance="b:8000",engine="1"}': "2x10",
                 'other{instance="a:8000"}': "3x10"})
    t = 60_000
    assert _values(e.instant('m{instance="a:8000"}', t)) == {
        (("__name__", "m"), ("engine", "0"), ("instance", "a:8000")): 1.0}
    assert len(e.instant('m{instance!="a:8000"}', t)) == 1
    assert len(e.instant('m{instance=~"a"}', t)) == 0  # regexes are anchored
    assert len(e.instant('m{instance=~"a.*|b.*"}', t)) == 2
    assert len(e.instant('m{engine!~"0"}', t)) == 1
    assert len(e.instant('{__name__=~"m|other"}', t)) == 3
    assert len(e.instant('m{missing=""}', t)) == 2  # an absent label matches the empty string


def test_lookback_is_five_minutes_inclusive_and_staleness_ends_a_series():
    e = _engine({"g": "7 _x30", "s": "1 2 stale 3"})
    assert e.instant("g", 300_000)[0].value == 7.0  # exactly 5m after the sample: still there
    assert e.instant("g", 300_001) == []
    assert e.instant("s", 29_000)[0].value == 2.0
    assert e.instant("s", 30_000) == []  # the stale marker is the newest sample
    assert e.instant("s", 45_000)[0].value == 3.0


def test_rate_extrapolation_counter_reset_and_zero_floor():
    # values checked with promtool 2.42 (promql_expr_test)
    e = _engine({'c{i="1"}': "0+10x20 5+10x10", 'c{i="2"}': "100+3x40"})
    got = _values(e.instant("rate(c[1m])", 330_000))
    assert got[(("i", "1"),)] == pytest.approx(0.5833333333333334, rel=0, abs=0)
    assert got[(("i", "2"),)] == 0.2
    assert _values(e.instant("increase(c[5m])", 330_000))[(("i", "1"),)] == 195.0
    assert _values(e.instant("resets(c[10m])", 330_000)) == {(("i", "1"),): 1.0, (("i", "2"),): 0.0}
    # a counter that starts inside the window is not extrapolated below zero
    e2 = _engine({"z": "_x3 1 2 3 4"})
    assert e2.instant("increase(z[1m])", 105_000)[0].value == pytest.approx(4.0)


def test_range_query_matches_instant_query_at_every_step():
    e = _engine({'c{i="1"}': "0+10x20 5+10x10 stale", 'c{i="2"}': "1+3x40",
                 'g{i="1"}': "1 3 2 _ 5 4 stale 6 7 8 9 10"})
    for expr in ["rate(c[1m])", "sum(irate(c[45s]))", "max_over_time(g[1m])", "avg_over_time(g[2m])",
                 "g > 3", "deriv(c[2m])", "c - on(i) g", "histogram_quantile(0.5, c)", "time()"]:
        series = e.range(expr, 0, 600_000, 30_000)
        for t in range(0, 600_001, 30_000):
            inst = e.instant(expr, t)
            if isinstance(inst, float):
                want = {(): inst}
            else:
                want = _values(inst)
            have = {tuple(sorted(s.labels.items())): v for s in series for (pt, v) in s.points if pt == t}
            assert have.keys() == want.keys(), (expr, t)
            for k in want:
                assert have[k] == want[k] or (math.isnan(have[k]) and math.isnan(want[k])), (expr, t, k)


def test_histogram_quantile_edge_cases():
    e = _engine({'h_bucket{le="1"}': "0+1x10", 'h_bucket{le="2"}': "0+2x10", 'h_bucket{le="+Inf"}': "0+4x10",
                 'noinf_bucket{le="1"}': "1x10", 'nolabel_bucket': "1x10",
                 'mono_bucket{le="1"}': "5x10", 'mono_bucket{le="2"}': "3x10", 'mono_bucket{le="+Inf"}': "6x10"})
    t = 150_000
    assert e.instant("histogram_quantile(0.25, h_bucket)", t)[0].value == 1.0
    assert e.instant("histogram_quantile(0.9, h_bucket)", t)[0].value == 2.0  # rank in +Inf bucket
    assert e.instant("histogram_quantile(-1, h_bucket)", t)[0].value == -math.inf
    assert e.instant("histogram_quantile(2, h_bucket)", t)[0].value == math.inf
    assert math.isnan(e.instant("histogram_quantile(0.5, noinf_bucket)", t)[0].value)
    assert e.instant("histogram_quantile(0.5, nolabel_bucket)", t) == []  # no le: skipped
    # non-monotonic counts are raised to the running maximum: le=2 counts 5, so rank 3 falls in le=1
    assert e.instant("histogram_quantile(0.5, mono_bucket)", t)[0].value == 0.6
    assert e.instant("histogram_quantile(0.5, h_bucket)", t)[0].labels == {}


def test_vector_matching_and_set_operators():
    e = _engine({'a{instance="x",engine="0"}': "10x5", 'a{instance="y",engine="0"}': "20x5",
                 'b{instance="x"}': "2x5", 'b{instance="y"}': "4x5",
                 'info{instance="x",version="1"}': "1x5"})
    t = 60_000
    assert _values(e.instant("a / on(instance) group_left b", t)) == {
        (("engine", "0"), ("instance", "x")): 5.0, (("engine", "0"), ("instance", "y")): 5.0}
    assert _values(e.instant("a * on(instance) group_left(version) info", t)) == {
        (("engine", "0"), ("instance", "x"), ("version", "1")): 10.0}
    assert _values(e.instant("a > bool 15", t)) == {
        (("engine", "0"), ("instance", "x")): 0.0, (("engine", "0"), ("instance", "y")): 1.0}
    assert [s.labels["instance"] for s in e.instant("a and on(instance) info", t)] == ["x"]
    assert [s.labels["instance"] for s in e.instant("a unless on(instance) info", t)] == ["y"]
    assert len(e.instant("a or b", t)) == 4
    assert _values(e.instant("2 * a", t))[(("engine", "0"), ("instance", "x"))] == 20.0
    assert e.instant("1 < bool 2", t) == 1.0
    with pytest.raises(PromQLError, match="many-to-one matching must be explicit"):
        e.instant("a + on() vector(1)", t)
    with pytest.raises(PromQLError, match="duplicate series for the match group"):
        e.instant("vector(1) + on() a", t)


def test_aggregations_by_and_without():
    e = _engine({'r{instance="x",engine="0"}': "1x5", 'r{instance="x",engine="1"}': "3x5",
                 'r{instance="y",engine="0"}': "8x5"})
    t = 60_000
    assert _values(e.instant("sum by (instance) (r)", t)) == {(("instance", "x"),): 4.0, (("instance", "y"),): 8.0}
    assert _values(e.instant("max without (engine) (r)", t)) == {(("instance", "x"),): 3.0, (("instance", "y"),): 8.0}
    assert e.instant("count(r)", t)[0].value == 3.0
    assert e.instant("avg(r)", t)[0].value == 4.0
    assert e.instant("stddev(r)", t)[0].value == pytest.approx(math.sqrt(26 / 3))
    assert e.instant("quantile(0.5, r)", t)[0].value == 3.0
    assert [s.labels for s in e.instant("topk(1, r)", t)] == [{"__name__": "r", "instance": "y", "engine": "0"}]
    assert _values(e.instant("bottomk by (instance) (1, r)", t)) == {
        (("__name__", "r"), ("engine", "0"), ("instance", "x")): 1.0,
        (("__name__", "r"), ("engine", "0"), ("instance", "y")): 8.0}


def test_sum_adds_a_large_group_series_by_series_at_an_instant_and_over_a_range():
    # 12 series of inexact values: pairwise summation (numpy's for one column) differs from adding in order
    values = [636.9616873214543, 269.7867137638703, 40.97352393619469, 16.527635528529096, 813.2702392002724,
              912.7555772777217, 606.6357757671799, 729.4965609839984, 543.6249914654229, 935.0724237877682,
              815.8535541215322, 2.738500170148095]
    e = _engine({f'r{{instance="x",engine="{i:02d}"}}': f"{v!r}x5" for i, v in enumerate(values)})
    in_order = 0.0
    for v in values:  # the catalog orders series by labels: engine 00, 01, ... as listed
        in_order += v
    assert e.instant("sum(r)", 60_000)[0].value == in_order
    assert e.instant("sum by (instance) (r)", 60_000)[0].value == in_order
    assert [v for _, v in e.range("sum(r)", 0, 60_000, 15_000)[0].points] == [in_order] * 5
    assert e.instant("count(r)", 60_000)[0].value == 12.0


def test_functions_absent_scalar_vector_clamp_and_offset():
    e = _engine({'g{instance="x"}': "1 2 3 4 5 6 7 8"})
    t = 105_000
    assert _values(e.instant('absent(nope{job="j",instance=~"x"})', t)) == {(("job", "j"),): 1.0}
    assert e.instant("absent(g)", t) == []
    assert e.instant("scalar(g) * 2", t) == 16.0
    assert _values(e.instant("vector(time())", t)) == {(): 105.0}
    assert e.instant("clamp_max(g, 5)", t)[0].value == 5.0
    assert e.instant("clamp(g, 9, 1)", t) == []  # max < min: empty, as Prometheus
    assert e.instant("g offset 30s", t)[0].value == 6.0
    assert e.instant("last_over_time(g[1m])", t)[0].labels["__name__"] == "g"  # keeps the name
    assert "__name__" not in e.instant("abs(g)", t)[0].labels
    m = e.instant("g[30s]", t)
    assert isinstance(m[0], Series) and m[0].points == [(75_000, 6.0), (90_000, 7.0), (105_000, 8.0)]


def test_unsupported_constructs_are_named_not_guessed():
    e = _engine({"g": "1x5"})
    with pytest.raises(Unsupported, match="unsupported: function label_join"):
        e.instant('label_join(g, "a", ",", "b")', 30_000)
    with pytest.raises(Unsupported, match="unsupported: subquery"):
        e.instant("max_over_time(g[5m:1m])", 30_000)
    with pytest.raises(Unsupported, match="unsupported: @ modifier"):
        e.instant("g @ 10", 30_000)
    with pytest.raises(Unsupported, match="count_values"):
        e.instant('count_values("v", g)', 30_000)
    with pytest.raises(PromQLError, match="cannot parse"):
        e.instant("sum(", 30_000)


def test_duplicate_labelsets_after_dropping_the_name_are_an_error():
    e = _engine({'a{i="1"}': "1x5", 'b{i="1"}': "2x5"})
    with pytest.raises(PromQLError, match="same labelset"):
        e.instant('rate({__name__=~"a|b"}[1m])', 60_000)


def test_vectorised_bucket_quantile_equals_the_scalar_one():
    import random

    import numpy as np

    from vllm_sentinel.agent.promql import functions as fn

    rng = random.Random(1)
    for _ in range(500):
        bounds = np.array([rng.choice([-1.0, 0.0, 0.5, 1.0, 2.0, 5.0, math.inf]) for _ in range(rng.randint(1, 6))])
        counts = np.array([[float(rng.randint(0, 6)) for _ in range(4)] for _ in bounds])
        q = np.array([rng.choice([0.0, 0.25, 0.5, 0.9, 1.0, -0.1, 1.1, math.nan]) for _ in range(4)])
        vec = fn.bucket_quantile_steps(q, bounds, counts)
        for t in range(4):
            one = fn.bucket_quantile(float(q[t]), bounds, counts[:, t])
            assert one == vec[t] or (math.isnan(one) and math.isnan(vec[t]))


def test_several_counter_resets_in_one_window_are_added_in_time_order():
    # promtool 2.42 answers 13 for increase(c[1m]) at 60s over 0 5 1 6 2 (resets add 5 and 6)
    e = _engine({"c": "0 5 1 6 2"})
    assert e.instant("increase(c[1m])", 60_000)[0].value == 13.0
    assert e.instant("resets(c[1m])", 60_000)[0].value == 2.0
    assert e.instant("changes(c[1m])", 60_000)[0].value == 4.0


def test_an_empty_left_side_gives_an_empty_result_without_reading_the_right_side():
    # alert rules read `condition and on (...) costlier conditions`: nothing to keep on the left, nothing to read
    e = _engine({'g{i="1"}': "1x20", 'h{i="1"}': "5x20"})
    t = 120_000
    read: list[str] = []
    evaluate = e._eval

    def spy(node, ctx):
        if getattr(node, "name", None) == "h":
            read.append("h")
        return evaluate(node, ctx)

    e._eval = spy  # type: ignore[method-assign]
    for expr in ["g > 5 and on(i) h", "g > 5 unless h", "(g > 5) + h", "(g > 5) > on(i) group_left h",
                 "(g > 5) * 2 + h", "sum by (i) (g > 5) / on(i) h"]:
        assert e.instant(expr, t) == [], expr
        assert [s for s in e.range(expr, 0, t, 30_000) if s.points] == [], expr
    assert read == []
    # `or` keeps the right side's series: it is read
    assert _values(e.instant("g > 5 or h", t)) == {(("__name__", "h"), ("i", "1")): 5.0} and read
    # a left side with a sample at some step of a range query is no empty side
    e2 = _engine({'g{i="1"}': "1 9 1 1 1", 'h{i="1"}': "5x4"})
    assert [[v for _, v in s.points] for s in e2.range("g > 5 and on(i) h", 0, 60_000, 15_000)] == [[9.0]]
