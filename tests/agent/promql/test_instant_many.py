"""instant_many answers each (expression, time) exactly as instant() does, on the differential's random cases."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

from vllm_sentinel.agent.promql.engine import Engine, PromQLError
from vllm_sentinel.agent.promql.notation import load_input_series
from vllm_sentinel.agent.store.db import Store

_spec = importlib.util.spec_from_file_location(
    "promql_differential_generate_many", Path(__file__).parent / "differential" / "generate.py")
generate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = generate
_spec.loader.exec_module(generate)


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b)))
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.labels != y.labels:
            return False
        if hasattr(x, "points"):
            if x.points != y.points:
                return False
        elif not (x.value == y.value or (math.isnan(x.value) and math.isnan(y.value))):
            return False
    return True


def test_many_instant_queries_at_once_equal_each_alone():
    rng = random.Random(11)
    compared = 0
    for _ in range(12):
        g = generate.make_group(rng)
        store = Store.open(":memory:")
        try:
            load_input_series(store, g.series, g.interval_s * 1000)
            engine = Engine(store)
            asked = []
            for _ in range(10):
                expr = generate.make_expr(rng)
                # several times per expression: some close together (one shared evaluation), one far away
                base = rng.randint(g.interval_s * 2, g.interval_s * g.length) * 1000
                times = sorted({base, base + g.interval_s * 1000, base + 7_000, base + 3_600_000})
                asked += [(expr, t) for t in times]
            alone = []
            for expr, t in asked:
                try:
                    alone.append(engine.instant(expr, t))
                except PromQLError as e:
                    alone.append(type(e))
            ok_asked = [q for q, a in zip(asked, alone) if not isinstance(a, type)]
            ok_alone = [a for a in alone if not isinstance(a, type)]
            failing = {q[0] for q, a in zip(asked, alone) if isinstance(a, type)}
            ok = [(q, a) for q, a in zip(ok_asked, ok_alone) if q[0] not in failing]
            together = engine.instant_many([q for q, _ in ok])
            for (q, a), b in zip(ok, together):
                assert _same(a, b), (q, a, b)
                compared += 1
        finally:
            store.close()
    assert compared > 200
