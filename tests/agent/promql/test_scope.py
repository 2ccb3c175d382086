"""Scoping PromQL to a selector: every vector selector gets the matchers, values survive printing,
the shipped pack stays valid for promtool, and scoping to everything changes no number."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import promql_parser as pp
import pytest
import yaml

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.replay import default_recording
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.promql.parser import PromQLError, Unsupported
from vllm_sentinel.agent.promql.scope import Matcher, format_selector, parse_selector, scope_expr
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import ingest_file

JOB = parse_selector('{job="vllm", namespace=~"prod-.*"}')


def pack_exprs() -> list[str]:
    """Every alert and evidence expression of the shipped pack."""
    return [e for f in load_pack() for r in f.rules for e in [r.expr, *(ev.expr for ev in r.evidence)]]


def selectors(expr: str) -> list[pp.VectorSelector]:
    found: list[pp.VectorSelector] = []
    pp.walk(pp.parse(expr), pre_visit=lambda n: found.append(n) if isinstance(n, pp.VectorSelector) else None)
    return found


def matcher_set(sel: pp.VectorSelector) -> set[tuple[str, str, str]]:
    ops = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}
    return {(m.name, ops[str(m.op)], m.value) for m in sel.matchers.matchers}


def test_parse_selector() -> None:
    assert JOB == (Matcher("job", "=", "vllm"), Matcher("namespace", "=~", "prod-.*"))
    assert format_selector(JOB) == '{job="vllm",namespace=~"prod-.*"}'


@pytest.mark.parametrize("text,message", [
    ('job="vllm"', "in braces"),
    ('up{job="vllm"}', "in braces"),
    ('{job="vllm"} offset 1m', "in braces"),
    ('{__name__="up"}', "metric name"),
    ('{job=vllm}', "cannot parse"),
    ('{job="a" or job="b"}', "`or` between matchers"),
])
def test_bad_selectors_name_the_form_wanted(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_selector(text)


def test_every_selector_of_every_pack_expression_is_scoped() -> None:
    wanted = {("job", "=", "vllm"), ("namespace", "=~", "prod-.*")}
    for expr in pack_exprs():
        scoped = scope_expr(expr, JOB)
        before, after = selectors(expr), selectors(scoped)
        assert len(after) == len(before), expr
        for b, a in zip(before, after):
            assert a.name == b.name and matcher_set(a) == matcher_set(b) | wanted, (expr, scoped)
            assert a.offset == b.offset


def test_ranges_offsets_subqueries_and_both_sides_of_operators() -> None:
    expr = 'max_over_time((up == 1)[5m:30s] offset 1m) + on (instance) group_left rate(x_total{a="b"}[2m] offset 5m)'
    assert scope_expr(expr, parse_selector('{job="v"}')) == (
        'max_over_time((up{job="v"} == 1)[5m:30s] offset 1m) + on (instance) group_left () '
        'rate(x_total{a="b",job="v"}[2m] offset 5m)')


def test_quotes_and_backslashes_survive_the_printer() -> None:
    sel = (Matcher("ns", "=~", 'a\\.b"c'),)
    expr = r'label_replace(up{path="C:\\dir \"x\""}, "d", "$1", "s", "a\\.(.*)")'
    scoped = scope_expr(expr, sel)
    [s] = selectors(scoped)
    assert matcher_set(s) == {("path", "=", 'C:\\dir "x"'), ("ns", "=~", 'a\\.b"c')}
    strings: list[str] = []
    pp.walk(pp.parse(scoped), pre_visit=lambda n: strings.append(n.val) if isinstance(n, pp.StringLiteral) else None)
    assert strings == ["d", "$1", "s", "a\\.(.*)"]


def test_no_selector_sends_the_expression_untouched() -> None:
    assert scope_expr("up  ==  0", ()) == "up  ==  0"


def test_a_bad_expression_is_a_promql_error() -> None:
    with pytest.raises(PromQLError, match="cannot parse PromQL"):
        scope_expr("sum(", JOB)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_accepts_the_scoped_pack(tmp_path: Path) -> None:
    rules = [{"record": f"scoped:expr{i}", "expr": scope_expr(e, JOB)} for i, e in enumerate(pack_exprs())]
    path = tmp_path / "scoped.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "scoped", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("scope") / "rec.duckdb"
    with Store.open(path) as store:
        res = ingest_file(store, default_recording())
        yield store, res.first_ms, res.last_ms


def test_scoping_to_every_instance_changes_no_number(recorded) -> None:
    """On the recorded real session: each expression scoped to {instance=~".+"} gives exactly its numbers."""
    store, first, last = recorded
    engine = Engine(store)
    everything = parse_selector('{instance=~".+"}')
    compared = 0
    for expr in pack_exprs():
        try:
            plain = engine.range(expr, first, last, 15_000)
        except Unsupported:
            continue  # a subquery: Prometheus evaluates it, the local engine does not
        scoped = engine.range(scope_expr(expr, everything), first, last, 15_000)
        as_map = lambda res: {tuple(sorted(s.labels.items())): s.points for s in res}  # noqa: E731
        a, b = as_map(plain), as_map(scoped)
        assert a.keys() == b.keys(), expr
        for k in a:
            assert [(t, None if math.isnan(v) else v) for t, v in a[k]] == \
                   [(t, None if math.isnan(v) else v) for t, v in b[k]], expr
        compared += bool(a)
    assert compared > 20  # most expressions have data in the recording: the comparison is not vacuous
