"""Sparklines: scaling, NaN holes, resampling that keeps peaks."""

from __future__ import annotations

import doctest
import math

import pytest

from vllm_sentinel.reports import sparkline as mod
from vllm_sentinel.reports.sparkline import BARS, resample, sparkline


def test_docstring_examples_hold() -> None:
    assert doctest.testmod(mod).failed == 0


def test_min_and_max_map_to_lowest_and_highest_bar() -> None:
    line = sparkline([3.0, 10.0, 5.0])
    assert line[0] == BARS[0] and line[1] == BARS[-1] and len(line) == 3


def test_missing_values_are_holes_not_low_bars() -> None:
    line = sparkline([1.0, math.nan, None, math.inf, 2.0])
    assert line[1:4] == "   " and line[0] == BARS[0] and line[4] == BARS[-1]


def test_all_missing_gives_blanks_of_the_same_length() -> None:
    assert sparkline([None, math.nan]) == "  "


def test_fixed_scale_keeps_a_low_signal_low() -> None:
    # 3 % against a 0..90 % scale must not reach full height
    assert sparkline([0.01, 0.03], lo=0.0, hi=0.9) == BARS[0] * 2


def test_values_outside_a_fixed_scale_are_clamped() -> None:
    assert sparkline([-5, 50], lo=0, hi=10) == BARS[0] + BARS[-1]


def test_resample_keeps_the_peak_of_each_bucket() -> None:
    values = [0.0] * 100
    values[57] = 9.0
    line = sparkline(values, width=10)
    assert len(line) == 10 and line.count(BARS[-1]) == 1


def test_resample_bucket_of_only_gaps_stays_a_gap() -> None:
    assert resample([1, 2, None, None, 3, 4], 3) == [2, None, 4]


def test_width_must_be_positive() -> None:
    with pytest.raises(ValueError, match="width"):
        sparkline([1, 2], width=0)


def test_time_buckets_show_absent_points_as_gaps() -> None:
    # a range query leaves out steps with no sample: the time axis, not the point count, places the bars
    from vllm_sentinel.reports.sparkline import bucket_by_time, time_sparkline
    points = [(t, 1.0) for t in range(0, 40)] + [(t, 2.0) for t in range(60, 100)]
    assert bucket_by_time(points, 0, 100, 5)[2] is None
    assert time_sparkline(points, 0, 100, width=5, lo=0, hi=2)[2] == " "


def test_points_outside_the_window_are_ignored() -> None:
    from vllm_sentinel.reports.sparkline import bucket_by_time
    assert bucket_by_time([(-5, 9.0), (5, 1.0), (200, 9.0)], 0, 100, 2) == [1.0, None]
