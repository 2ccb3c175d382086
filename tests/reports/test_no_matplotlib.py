"""Without the charts extra (matplotlib) a report is still written, without charts, saying how to get them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

SCRIPT = """
import sys
sys.modules["matplotlib"] = None  # as on a host without the charts extra: every import of it fails
sys.path.insert(0, {here!r})
import logging
from report_goldens import load_fixture
from vllm_sentinel.reports.write import write_report
out = write_report(load_fixture("kv_cache_pressure"), {out!r})
print(out.markdown)
print(len(out.charts))
print(out.missing)
"""


def test_report_is_written_without_charts_and_says_how_to_get_them(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(here=str(HERE), out=str(tmp_path))],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    md, n_charts, missing = proc.stdout.strip().splitlines()
    text = Path(md).read_text()
    assert n_charts == "0" and not list(Path(md).parent.glob("*.png"))
    assert "![" not in text  # no link to a chart that is not there
    assert "No chart: matplotlib is not installed" in text
    assert "pip install 'vllm-sentinel[charts]'" in text and "pip install 'vllm-sentinel[charts]'" in missing
    assert "## Evidence" in text and "## Suggested fix" in text  # the rest of the report is all there
