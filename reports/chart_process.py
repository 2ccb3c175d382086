"""Draw a report's charts in a short-lived child process, so matplotlib never loads into the daemon.

Importing matplotlib and drawing costs the process that does it about 56 MiB that stay for its life.
The daemon writes a report when an incident opens or resolves; drawing in a child keeps its resident
memory at what scraping and evaluation need. The child reads the charts' data (`charts.chart_data`)
as JSON on stdin, draws each PNG, and prints the paths it wrote as JSON.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

from vllm_sentinel.reports.charts import CHARTS_MISSING, ChartsUnavailable, chart_filename, charts_available, draw_chart

MISSING_RC = 3  # the child's exit status when matplotlib cannot be imported there
TIMEOUT_S = 120.0  # a few PNGs take 1-3 s of CPU; a saturated 2-core host may stretch that tenfold
NICENESS = 10  # the serving process keeps its share of the CPU while charts are drawn


class ChartsFailed(RuntimeError):
    """The drawing process crashed or ran past its time: the report goes out without charts, saying so."""


_spent_lock = threading.Lock()
_spent_s = 0.0


def child_cpu_seconds() -> float:
    """CPU seconds the drawing processes of this process have used, as each reported at its end."""
    with _spent_lock:
        return _spent_s


def _add_spent(seconds: float) -> None:
    global _spent_s
    with _spent_lock:
        _spent_s += max(0.0, seconds)


def draw_in_child(charts: list[dict], directory: Path, *, timeout_s: float = TIMEOUT_S,
                  python: str = sys.executable) -> list[Path]:
    """Draw each chart into directory/<chart file> in a child process; the PNG paths, in order.

    Raises ChartsUnavailable when the child cannot import matplotlib, ChartsFailed on any other failure.
    """
    if not charts:
        return []  # nothing to draw: no process to start
    jobs = [{"data": c, "path": str(directory / chart_filename(c["signal"]))} for c in charts]
    try:
        # argv is fixed; the data travels on stdin, never on a command line
        proc = subprocess.run([python, "-m", "vllm_sentinel.reports.chart_process"], input=json.dumps(jobs),
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ChartsFailed(f"charts not drawn: the drawing process ran past {timeout_s:.0f} s") from None
    except OSError as e:
        raise ChartsFailed(f"charts not drawn: the drawing process did not start ({e})") from None
    if proc.returncode == MISSING_RC:
        raise ChartsUnavailable(CHARTS_MISSING)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ChartsFailed(f"charts not drawn: the drawing process failed ({last[:300]})")
    try:
        answer = json.loads(proc.stdout)
        drawn = [Path(p) for p in answer["drawn"]]
        _add_spent(float(answer["cpu_s"]))
    except (ValueError, TypeError, KeyError):
        raise ChartsFailed("charts not drawn: the drawing process answered no list of paths") from None
    return drawn


def main() -> int:
    """The child: draw the jobs read from stdin, print the written paths and its own CPU seconds as JSON."""
    try:
        os.nice(NICENESS)
    except OSError:
        pass  # not allowed here: draw at the inherited priority
    jobs = json.load(sys.stdin)
    if not charts_available():
        print(CHARTS_MISSING, file=sys.stderr)
        return MISSING_RC
    drawn = [str(draw_chart(job["data"], Path(job["path"]))) for job in jobs]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # the parent charges this to its CPU budget: only its own children's CPU, never a reaped vLLM server's
    print(json.dumps({"drawn": drawn, "cpu_s": usage.ru_utime + usage.ru_stime}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
