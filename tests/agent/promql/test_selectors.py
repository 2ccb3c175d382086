"""agent/promql/selectors.py: matchers added to every selector, nothing else changed."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.promql.parser import PromQLError, parse
from vllm_sentinel.agent.promql.selectors import selectors, with_matchers

ADD = lambda metric: ['i="1"']  # noqa: E731


@pytest.mark.parametrize("expr, expected", [
    ("foo", 'foo{i="1"}'),
    ('foo{a="1"} + xfoo', 'foo{a="1", i="1"} + xfoo{i="1"}'),
    ("rate(foo[5m] offset 1m)", 'rate(foo{i="1"}[5m] offset 1m)'),
    ("max_over_time((a / b)[10m:])", 'max_over_time((a{i="1"} / b{i="1"})[10m:])'),
    ("sum by (foo) (foo)", 'sum by (foo) (foo{i="1"})'),  # a label named like the metric is left alone
    ('label_replace(foo, "foo", "$1", "x", "(foo)")', 'label_replace(foo{i="1"}, "foo", "$1", "x", "(foo)")'),
    ('foo{i="2"}', 'foo{i="2"}'),  # a matcher on the label already: kept as written
    ("topk(3, foo) > bool 2", 'topk(3, foo{i="1"}) > bool 2'),
])
def test_matchers_go_on_every_selector(expr, expected):
    got = with_matchers(expr, ADD)
    assert " ".join(got.split()) == expected
    assert [s.name for s in selectors(parse(got))] == [s.name for s in selectors(parse(expr))]


def test_per_metric_matchers():
    got = with_matchers("a:x / b", lambda m: ['m="1"'] if m.startswith("a:") else [])
    assert got == 'a:x{m="1"} / b'


def test_bad_promql_is_a_promql_error():
    with pytest.raises(PromQLError):
        with_matchers("sum(", ADD)
