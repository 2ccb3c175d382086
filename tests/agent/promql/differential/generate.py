"""Differential cases for the PromQL engine: random vLLM-shaped series and expressions, judged by promtool.

Each case group gets its own input series; every expression is evaluated by OUR engine at a few
times, and the answers are written as promtool `promql_expr_test` expectations. `promtool test rules`
(Prometheus 2.42) then recomputes them and must agree exactly (it compares with reflect.DeepEqual).

    python tests/agent/promql/differential/generate.py --seed 7 --cases 2000   # more, locally
    PROMQL_DIFF_SEED=7 PROMQL_DIFF_CASES=2000 pytest tests/agent/promql/differential

Values are integers or multiples of 1/64 (exact in binary), so a sum does not depend on the order
of addition and what is compared is semantics: windows, lookback, staleness, extrapolation, resets,
matching, edge cases.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vllm_sentinel.agent.promql.engine import Engine, PromQLError
from vllm_sentinel.agent.promql.notation import load_input_series
from vllm_sentinel.agent.store.db import Store

TTFT_BUCKETS = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0",
                "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf"]
QUEUE_BUCKETS = ["0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0",
                 "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf"]
COUNTERS = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"]
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
HISTOGRAMS = {"vllm:time_to_first_token_seconds": TTFT_BUCKETS, "vllm:request_queue_time_seconds": QUEUE_BUCKETS}
INSTANCES = ["a:8000", "b:8000", "c:8000"]
DEFAULT_SEED = 20260601
DEFAULT_CASES = 520


@dataclass
class Group:
    """One promtool test group: input series plus the expressions evaluated over them."""

    interval_s: int
    series: list[dict]
    length: int
    tests: list[dict] = field(default_factory=list)


# -- series ---------------------------------------------------------------------------------------
def _fmt(v: float) -> str:
    return repr(float(v)) if v != int(v) else str(int(v))


def _values_text(values: list[float | None | str]) -> str:
    return " ".join("_" if v is None else v if isinstance(v, str) else _fmt(v) for v in values)


def _with_gaps(rng: random.Random, values: list) -> list:
    out = list(values)
    if rng.random() < 0.25:  # a scrape gap
        i = rng.randrange(1, len(out) - 1)
        for j in range(i, min(len(out), i + rng.randint(1, 4))):
            out[j] = None
    if rng.random() < 0.2:  # the target went away for a while: staleness marker, then nothing
        i = rng.randrange(len(out) // 2, len(out) - 1)
        out[i] = "stale"
        for j in range(i + 1, min(len(out), i + rng.randint(0, 30))):
            out[j] = None
    return out


def _counter(rng: random.Random, n: int) -> list:
    v, out = float(rng.randint(0, 500)), []
    rate = rng.choice([0, 1, 3, 10, 50])
    for _ in range(n):
        if rng.random() < 0.03:  # restart: the counter starts over
            v = float(rng.randint(0, 3))
        else:
            v += rng.randint(0, rate * 2)
        out.append(v)
    return _with_gaps(rng, out)


def _gauge(rng: random.Random, n: int, name: str) -> list:
    if name.endswith("perc"):
        v = rng.randint(0, 64)
        out = []
        for _ in range(n):
            v = min(64, max(0, v + rng.randint(-6, 6)))
            out.append(v / 64)
        return _with_gaps(rng, out)
    v, out = rng.randint(0, 8), []
    for _ in range(n):
        v = max(0, v + rng.randint(-2, 2))
        out.append(float(v))
    return _with_gaps(rng, out)


def _histogram(rng: random.Random, n: int, buckets: list[str]) -> list[list]:
    counts = [0.0] * len(buckets)
    rows = [[] for _ in buckets]
    centre = rng.randrange(len(buckets) - 1)
    for _ in range(n):
        if rng.random() < 0.02:
            counts = [0.0] * len(buckets)
        for _obs in range(rng.randint(0, 6)):
            b = min(len(buckets) - 1, max(0, centre + rng.randint(-3, 3)))
            for j in range(b, len(buckets)):
                counts[j] += 1
        for j in range(len(buckets)):
            rows[j].append(counts[j])
    return rows


def make_group(rng: random.Random) -> Group:
    """Random vLLM-shaped series for 1-3 instances (counters with resets, gauges, histograms)."""
    interval = rng.choice([10, 15, 15, 30])
    n = rng.randint(30, 70)
    series: list[dict] = []
    instances = INSTANCES[:rng.randint(1, 3)]
    for inst in instances:
        base = f'instance="{inst}",model_name="m"'
        for name in COUNTERS:
            series.append({"series": f'{name}{{{base},engine="0"}}', "values": _values_text(_counter(rng, n))})
        if rng.random() < 0.5:
            series.append({"series": f'vllm:prompt_tokens_total{{{base},engine="1"}}',
                           "values": _values_text(_counter(rng, n))})
        for name in GAUGES:
            series.append({"series": f'{name}{{{base},engine="0"}}', "values": _values_text(_gauge(rng, n, name))})
        for name, buckets in HISTOGRAMS.items():
            rows = _histogram(rng, n, buckets)
            for le, row in zip(buckets, rows):
                series.append({"series": f'{name}_bucket{{{base},engine="0",le="{le}"}}', "values": _values_text(row)})
    # histogram edge cases, under their own names so they do not disturb the well-formed ones
    inst = instances[0]
    rows = _histogram(rng, n, QUEUE_BUCKETS)
    for le, row in zip(QUEUE_BUCKETS[:-1], rows[:-1]):  # no +Inf bucket
        series.append({"series": f'edge_noinf_bucket{{instance="{inst}",le="{le}"}}', "values": _values_text(row)})
    rows = _histogram(rng, n, QUEUE_BUCKETS)
    for j, (le, row) in enumerate(zip(QUEUE_BUCKETS, rows)):
        if j == 5:  # a bucket counting less than its predecessor: non-monotonic
            row = [max(0.0, v - rng.randint(1, 5)) for v in row]
        series.append({"series": f'edge_nonmono_bucket{{instance="{inst}",le="{le}"}}', "values": _values_text(row)})
    series.append({"series": f'edge_nonmono_bucket{{instance="{inst}"}}', "values": _values_text(rows[0])})
    return Group(interval, series, n)


# -- expressions ----------------------------------------------------------------------------------
def _matchers(rng: random.Random) -> str:
    options = [
        "", "", '{instance="a:8000"}', '{instance!="b:8000"}', '{instance=~"a.*|c:8000"}',
        '{instance!~"c.*"}', '{engine="0"}', '{model_name=~"m"}', '{instance=~".*"}', '{engine!=""}',
    ]
    return rng.choice(options)


def _offset(rng: random.Random) -> str:
    return rng.choice(["", "", "", " offset 1m", " offset 30s", " offset 2m"])


def _range(rng: random.Random) -> str:
    return rng.choice(["30s", "1m", "1m", "90s", "2m", "5m", "10m"])


def _range_expr(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.45:
        m = rng.choice(COUNTERS)
        f = rng.choice(["rate", "rate", "irate", "increase", "resets", "changes"])
        return f"{f}({m}{_matchers(rng)}[{_range(rng)}]{_offset(rng)})"
    m = rng.choice(GAUGES)
    f = rng.choice(["delta", "idelta", "deriv", "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
                    "count_over_time", "last_over_time", "quantile_over_time", "predict_linear",
                    "stddev_over_time", "stdvar_over_time", "present_over_time", "changes"])
    sel = f"{m}{_matchers(rng)}[{_range(rng)}]{_offset(rng)}"
    if f == "quantile_over_time":
        return f"quantile_over_time({rng.choice(['0', '0.25', '0.5', '0.9', '1', '-1', '2'])}, {sel})"
    if f == "predict_linear":
        return f"predict_linear({sel}, {rng.choice(['60', '300', '-30'])})"
    return f"{f}({sel})"


def _instant(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return f"{rng.choice(COUNTERS + GAUGES)}{_matchers(rng)}{_offset(rng)}"
    if r < 0.8:
        return _range_expr(rng)
    name, _ = rng.choice(list(HISTOGRAMS.items()))
    q = rng.choice(["0.5", "0.9", "0.99", "0", "1", "-0.5", "1.5", "0.25"])
    by = rng.choice(["le", "le, instance", "le, instance, engine"])
    return f"histogram_quantile({q}, sum by ({by}) (rate({name}_bucket{_matchers(rng)}[{_range(rng)}])))"


def _agg(rng: random.Random, inner: str) -> str:
    op = rng.choice(["sum", "avg", "min", "max", "count", "stddev", "stdvar", "group", "quantile", "topk",
                     "bottomk"])
    mod = rng.choice(["", " by (instance)", " by (engine)", " without (engine)", " by (instance, model_name)",
                      " without (instance)"])
    if op == "quantile":
        return f"quantile{mod} ({rng.choice(['0.5', '0.9', '0', '1'])}, {inner})"
    if op in ("topk", "bottomk"):
        return f"{op}{mod} ({rng.choice(['1', '2', '5'])}, {inner})"
    return f"{op}{mod} ({inner})"


def make_expr(rng: random.Random) -> str:
    """One expression from the supported grammar, vLLM rule-shaped."""
    r = rng.random()
    if r < 0.25:
        return _instant(rng)
    if r < 0.45:
        return _agg(rng, _instant(rng))
    if r < 0.6:
        op = rng.choice(["+", "-", "*", "/", "%", ">", "<", ">=", "==", "!=", "> bool", "<= bool"])
        s = rng.choice(["0", "1", "0.5", "2", "100"])
        lhs = _instant(rng)
        return f"{lhs} {op} {s}" if rng.random() < 0.7 else f"{s} {op} {lhs}"
    if r < 0.75:
        a, b = rng.choice(COUNTERS), rng.choice(GAUGES)
        op = rng.choice(["+", "/", ">", "> bool", "-"])
        rr = _range(rng)
        return rng.choice([
            f"rate({a}[{rr}]) {op} on (instance, engine) {b}",
            f"rate({a}[{rr}]) {op} ignoring (engine) {b}{{engine=\"0\"}}",
            f"sum by (instance) (rate({a}[{rr}])) {op} on (instance) group_right sum by (instance, engine) ({b})",
            f"rate({a}[{rr}]) {op} on (instance) group_left (model_name) max by (instance, model_name) ({b})",
            f"{b} {op} {b} offset 1m",
        ])
    if r < 0.85:
        set_op = rng.choice(["and", "or", "unless"])
        on = rng.choice(["", " on (instance)", " ignoring (engine)"])
        return f"{_instant(rng)} > {rng.choice(['0', '1', '5'])} {set_op}{on} {_instant(rng)}"
    f = rng.choice(["clamp", "clamp_min", "clamp_max", "abs", "absent", "scalar", "vector", "time", "minus",
                    "absent_over_time", "round", "sqrt"])
    inner = _instant(rng)
    if f == "clamp":
        return f"clamp({inner}, {rng.choice(['0', '1'])}, {rng.choice(['0.5', '5', '100'])})"
    if f in ("clamp_min", "clamp_max"):
        return f"{f}({inner}, {rng.choice(['0', '1', '3'])})"
    if f == "absent":
        return rng.choice([f"absent({inner})", 'absent(nonexistent{job="x",instance=~"a.*"})',
                           'absent(vllm:num_requests_running{instance="zz:1"})'])
    if f == "absent_over_time":
        return f"absent_over_time({rng.choice(GAUGES)}{_matchers(rng)}[{_range(rng)}])"
    if f == "scalar":
        return f"scalar(sum({inner})) * {rng.choice(['1', '2'])}"
    if f == "vector":
        return rng.choice(["vector(1)", "vector(time())", f"vector(scalar({inner}))"])
    if f == "time":
        return "time() - 60"
    if f == "minus":
        return f"-{inner}"
    return f"{f}({inner})"


# -- evaluation and files -------------------------------------------------------------------------
def _label_text(labels: dict[str, str]) -> str:
    name = labels.get("__name__", "")
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def _yaml_value(v: float) -> float | str:
    return v  # yaml.safe_dump writes .inf/-.inf/.nan and repr() digits for floats


def build_cases(seed: int, cases: int) -> tuple[list[Group], dict[str, int]]:
    """Generate groups until `cases` expression tests exist; returns them with skip counts by reason."""
    rng = random.Random(seed)
    groups: list[Group] = []
    made = 0
    skipped = {"engine error": 0, "matrix or string": 0, "depends on series order": 0}
    while made < cases:
        g = make_group(rng)
        store = Store.open(":memory:")
        try:
            load_input_series(store, g.series, g.interval_s * 1000)
            engine = Engine(store)
            for _ in range(12):
                expr = make_expr(rng)
                t_s = rng.randint(g.interval_s * 2, g.interval_s * (g.length + 8))
                try:
                    got = engine.instant(expr, t_s * 1000)
                except PromQLError:
                    skipped["engine error"] += 1
                    continue
                if not _order_free(engine, expr, t_s * 1000, got, rng):
                    # promtool feeds aggregations in Go map order (random): sum/avg/stddev of inexact
                    # values and topk ties differ run to run in Prometheus itself
                    skipped["depends on series order"] += 1
                    continue
                if isinstance(got, float):
                    got_samples = [({}, got)]
                elif got and not hasattr(got[0], "value"):
                    skipped["matrix or string"] += 1
                    continue
                else:
                    got_samples = [(s.labels, s.value) for s in got]
                if any(math.isnan(v) for _, v in got_samples):
                    # promtool compares with DeepEqual, where NaN never equals NaN: test NaN-ness instead
                    if isinstance(got, float):
                        expr = f"vector({expr}) == bool vector({expr})"
                    else:
                        expr = f"({expr}) == bool ({expr})"
                    try:
                        got = engine.instant(expr, t_s * 1000)
                    except PromQLError:
                        skipped["engine error"] += 1
                        continue
                    got_samples = [(s.labels, s.value) for s in got]
                g.tests.append({"expr": expr, "eval_time": f"{t_s}s",
                                "exp_samples": [{"labels": _label_text(lb), "value": _yaml_value(v)}
                                                for lb, v in got_samples]})
                made += 1
                if made >= cases:
                    break
        finally:
            store.close()
        groups.append(g)
    return groups, skipped


def _order_free(engine: Engine, expr: str, t_ms: int, got, rng: random.Random) -> bool:
    """True when the answer is bit-identical whatever order the series enter aggregations in."""
    engine._check_order, engine._order_sensitive = True, False
    try:
        engine.instant(expr, t_ms)
        return not engine._order_sensitive
    finally:
        engine._check_order = False


def write_test_file(groups: list[Group], directory: Path) -> Path:
    """One promtool test file holding every group, plus the empty rules file it must name."""
    rules = directory / "empty.rules.yaml"
    rules.write_text("groups: []\n")
    # promtool loads samples only up to its last evaluation tick: a 1s interval covers every eval time
    doc = {"rule_files": [rules.name], "evaluation_interval": "1s", "tests": [
        {"name": f"group-{i}", "interval": f"{g.interval_s}s", "input_series": g.series,
         "promql_expr_test": g.tests} for i, g in enumerate(groups)]}
    path = directory / "differential.test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    return path


def run_promtool(path: Path, promtool: str = "promtool") -> tuple[int, str]:
    """Run `promtool test rules` on a file; returns (exit code, combined output)."""
    proc = subprocess.run([promtool, "test", "rules", path.name], cwd=path.parent, capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def explain_failures(output: str, groups: list[Group]) -> list[str]:
    """For each promtool disagreement: the expression, its inputs, our answer and promtool's."""
    reports = []
    for m in re.finditer(r'expr: "(?P<expr>(?:[^"\\]|\\.)*)", time: (?P<time>[^,\n]+),?(?P<body>(?:\n\s+(?:exp|got|err):.*)*)',
                         output):
        expr = m.group("expr").encode().decode("unicode_escape")
        owner = next((g for g in groups for t in g.tests if t["expr"] == expr), None)
        inputs = "\n".join(f"    {s['series']}: {s['values']}" for s in (owner.series if owner else []))
        reports.append(f"expr: {expr}\ntime: {m.group('time')}\n{m.group('body').rstrip()}\n"
                       f"interval: {owner.interval_s if owner else '?'}s\ninputs:\n{inputs}")
    if not reports and output.strip():
        reports.append(output[-4000:])
    return reports


def main(argv: list[str] | None = None) -> int:
    """CLI: generate cases, run promtool, print disagreements; exit 1 on any."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=int(os.environ.get("PROMQL_DIFF_SEED", DEFAULT_SEED)))
    ap.add_argument("--cases", type=int, default=int(os.environ.get("PROMQL_DIFF_CASES", DEFAULT_CASES)))
    ap.add_argument("--keep", type=Path, help="write the test files here instead of a temp dir")
    ap.add_argument("--promtool", default=shutil.which("promtool") or "promtool")
    args = ap.parse_args(argv)
    groups, skipped = build_cases(args.seed, args.cases)
    directory = args.keep or Path(tempfile.mkdtemp(prefix="promql-diff-"))
    directory.mkdir(parents=True, exist_ok=True)
    path = write_test_file(groups, directory)
    code, out = run_promtool(path, args.promtool)
    total = sum(len(g.tests) for g in groups)
    print(f"seed {args.seed}: {total} cases in {len(groups)} groups, skipped {skipped}; promtool exit {code}")
    if code != 0:
        for r in explain_failures(out, groups):
            print("-" * 80)
            print(r)
        print(f"files kept in {directory}")
        return 1
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
