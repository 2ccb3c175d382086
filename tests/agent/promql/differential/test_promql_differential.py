"""Our PromQL answers on random vLLM-shaped cases must equal promtool's (Prometheus 2.42), exactly.

Seed and size: PROMQL_DIFF_SEED / PROMQL_DIFF_CASES (defaults in generate.py); more locally with
`python tests/agent/promql/differential/generate.py --seed N --cases 5000`.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("promql_differential_generate", Path(__file__).with_name("generate.py"))
generate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = generate
_spec.loader.exec_module(generate)


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package `prometheus`); CI installs it")
def test_engine_agrees_with_promtool_on_random_cases(capsys):
    code = generate.main([])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "promtool exit 0" in out


def test_generator_is_deterministic_for_a_seed():
    a, _ = generate.build_cases(seed=5, cases=30)
    b, _ = generate.build_cases(seed=5, cases=30)
    assert [t["expr"] for g in a for t in g.tests] == [t["expr"] for g in b for t in g.tests]
    assert [g.series for g in a] == [g.series for g in b]
