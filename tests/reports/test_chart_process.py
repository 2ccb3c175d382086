"""Charts drawn in a child process: the same PNGs, matplotlib never in the caller, failures said in the report."""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from report_goldens import load_fixture
from vllm_sentinel.reports.chart_process import ChartsFailed, draw_in_child
from vllm_sentinel.reports.charts import ChartsUnavailable
from vllm_sentinel.reports.write import plan_charts, write_report

HERE = Path(__file__).parent

NO_MATPLOTLIB_CHILD = """#!{python}
import runpy, sys
sys.modules["matplotlib"] = None  # a host without the charts extra
runpy.run_module(sys.argv[2], run_name="__main__")
"""

CRASHING_CHILD = """#!{python}
import sys
print("drawing blew up: font cache unreadable", file=sys.stderr)
sys.exit(1)
"""

HANGING_CHILD = """#!{python}
import time
time.sleep(60)
"""


def _child(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text(text.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_child_draws_the_same_pngs_as_drawing_here(tmp_path: Path) -> None:
    data = load_fixture("kv_cache_pressure")
    here = write_report(data, tmp_path / "here")
    child = write_report(data, tmp_path / "child", draw=draw_in_child)
    assert [p.name for p in child.charts] == [p.name for p in here.charts] and child.charts
    assert [p.read_bytes() for p in child.charts] == [p.read_bytes() for p in here.charts]
    assert child.markdown.read_text() == here.markdown.read_text() and child.missing == []


def test_drawing_in_a_child_keeps_matplotlib_out_of_the_caller(tmp_path: Path) -> None:
    script = (f"import sys; sys.path.insert(0, {str(HERE)!r})\n"
              "from report_goldens import load_fixture\n"
              "from vllm_sentinel.reports.write import write_report\n"
              "from vllm_sentinel.reports.chart_process import draw_in_child\n"
              f"out = write_report(load_fixture('kv_cache_pressure'), {str(tmp_path)!r}, draw=draw_in_child)\n"
              "print(len(out.charts), 'matplotlib' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    n, loaded = proc.stdout.split()
    assert int(n) > 0 and loaded == "False"
    assert all(p.stat().st_size > 0 for p in tmp_path.glob("*/chart-*.png"))


def test_a_child_without_matplotlib_gives_the_report_without_charts_and_the_install_line(tmp_path: Path) -> None:
    draw = functools.partial(draw_in_child, python=_child(tmp_path, NO_MATPLOTLIB_CHILD))
    with pytest.raises(ChartsUnavailable):
        draw(plan_charts(load_fixture("kv_cache_pressure")), tmp_path)
    out = write_report(load_fixture("kv_cache_pressure"), tmp_path / "out", draw=draw)
    text = out.markdown.read_text()
    assert out.charts == [] and not list(out.directory.glob("*.png")) and "![" not in text
    assert "No chart: matplotlib is not installed" in text and "pip install 'vllm-sentinel[charts]'" in text


def test_a_crashing_child_gives_the_report_without_charts_and_says_why(tmp_path: Path) -> None:
    draw = functools.partial(draw_in_child, python=_child(tmp_path, CRASHING_CHILD))
    out = write_report(load_fixture("kv_cache_pressure"), tmp_path / "out", draw=draw)
    text = out.markdown.read_text()
    assert out.charts == [] and "![" not in text
    assert "No chart: drawing them failed" in text and "font cache unreadable" in text
    assert out.missing and "font cache unreadable" in out.missing[0]
    assert "## Evidence" in text and "## Suggested fix" in text  # the rest of the report is all there


def test_a_child_past_its_time_is_stopped_and_said(tmp_path: Path) -> None:
    charts = plan_charts(load_fixture("kv_cache_pressure"))
    with pytest.raises(ChartsFailed, match="ran past 1 s"):
        draw_in_child(charts, tmp_path, timeout_s=1, python=_child(tmp_path, HANGING_CHILD))


def test_no_charts_start_no_process(tmp_path: Path) -> None:
    assert draw_in_child([], tmp_path, python=str(tmp_path / "no-such-python")) == []
