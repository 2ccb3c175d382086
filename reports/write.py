"""Write one incident report to disk: DIR/<incident-id>/report.md with its chart PNGs beside it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from vllm_sentinel.reports.assemble import assemble
from vllm_sentinel.reports.chart_process import ChartsFailed
from vllm_sentinel.reports.charts import (CHARTS_MISSING, ChartsUnavailable, chart_data, chart_filename,
                                          charts_available, draw_chart)
from vllm_sentinel.reports.markdown import ReportData, incident_span, render_markdown

REPORT_NAME = "report.md"


@dataclass
class WrittenReport:
    """Where a report went: its folder, the Markdown file, the chart PNGs, and what it lacks (no charts)."""

    directory: Path
    markdown: Path
    charts: list[Path]
    missing: list[str] = field(default_factory=list)  # e.g. CHARTS_MISSING: the caller says it once


def plan_charts(data: ReportData) -> list[dict]:
    """Chart data for each evidence signal that has samples, in evidence order (see charts.chart_data)."""
    span = incident_span(data)
    out = []
    for ev in data.incident.get("evidence") or []:
        series = data.evidence_series.get(ev["signal"]) or []
        if not any(v is not None for _, pts in series for _, v in pts):
            continue  # an empty chart says less than the evidence table's "no samples"
        out.append(chart_data(ev["signal"], series, window_ms=data.window_ms, incident_ms=span,
                              threshold=ev.get("threshold"), unit=ev.get("unit", ""),
                              description=data.evidence_descriptions.get(ev["signal"], "")))
    return out


def prepare(data: ReportData, with_charts: bool = True, why_not: str = CHARTS_MISSING) -> tuple[str, list[dict]]:
    """The report's Markdown and its charts' data, without touching the disk (what golden tests check).

    Without charts (matplotlib missing, or drawing failed: `why_not`) the Markdown links none and says
    why under "What was not checked".
    """
    if not with_charts:
        return render_markdown(replace(data, charts=[], missing=[*data.missing, why_not])), []
    charts = plan_charts(data)
    text = render_markdown(replace(data, charts=[c["signal"] for c in charts]))
    return text, charts


def report_dir_name(incident_id: str) -> str:
    """A folder name for an incident id, safe on every filesystem."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", incident_id).strip("._")
    if not name:
        raise ValueError(f"incident id {incident_id!r} gives no usable folder name")
    return name


Drawer = Callable[[list[dict], Path], list[Path]]  # (charts' data, folder) -> PNG paths, as draw_here


def draw_here(charts: list[dict], directory: Path) -> list[Path]:
    """Draw the charts in this process (ChartsUnavailable without matplotlib)."""
    if charts and not charts_available():
        raise ChartsUnavailable(CHARTS_MISSING)
    return [draw_chart(c, directory / chart_filename(c["signal"])) for c in charts]


def write_report(data: ReportData, out_dir: str | Path, draw: Drawer = draw_here) -> WrittenReport:
    """Write report.md and one PNG per charted signal into out_dir/<incident id>/; returns the paths.

    `draw` makes the PNGs: here, or `chart_process.draw_in_child` (the daemon: matplotlib never loads
    into it). Without matplotlib, or when drawing fails, the report is written without charts and says why.
    """
    directory = Path(out_dir) / report_dir_name(data.incident["id"])
    directory.mkdir(parents=True, exist_ok=True)
    text, charts = prepare(data)
    missing: list[str] = []
    try:
        pngs = draw(charts, directory)
    except (ChartsUnavailable, ChartsFailed) as e:  # the charts extra is optional: the report itself never is
        why = CHARTS_MISSING if isinstance(e, ChartsUnavailable) else str(e)
        text, pngs, missing = prepare(data, with_charts=False, why_not=why)[0], [], [why]
    md = directory / REPORT_NAME
    # write to a temp name first: a reader (a browser, the sidecar's API) never sees half a report
    tmp = md.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(md)
    return WrittenReport(directory=directory, markdown=md, charts=pngs, missing=missing)


def report_for_incident(store: object, incident_id: str, out_dir: str | Path, *, now_ms: int,
                        rules: list | None = None, draw: Drawer = draw_here) -> WrittenReport:
    """Assemble and write the report of one incident (what the sidecar calls when one fires or resolves)."""
    return write_report(assemble(store, incident_id, now_ms=now_ms, rules=rules), out_dir, draw=draw)
