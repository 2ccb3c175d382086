"""The full Markdown of a diagnose document: the window's health, then one report per incident."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms
from vllm_sentinel.reports.assemble import assemble_incident
from vllm_sentinel.reports.markdown import ReportData, render_markdown
from vllm_sentinel.reports.mdescape import escape_md


def diagnose_markdown(store: Any, doc: dict, rules: list | None = None,
                      assemble_one: Callable[[dict], ReportData] | None = None) -> str:
    """The full Markdown of a diagnose document: the window's health, then one report per incident.

    Each incident's report data comes from `store`, or from `assemble_one(incident)` when given (a
    document read from Prometheus: reports/assemble_remote.py).
    """
    w = doc["window"]
    # instances and signal names come from scraped data: escaped like every value in a report
    lines = [f"# vllm-sentinel diagnosis, {escape_md(w['start'])} .. {escape_md(w['end'])}", "",
             f"Source: {escape_md(doc['source'], code=True)}. "
             f"Instances: {', '.join(escape_md(i) for i in doc['instances'])}. Incidents: {len(doc['incidents'])}.", ""]
    for s in doc.get("summary", []):
        lines += [f"## Health of {escape_md(s['instance'])}", "", "| signal | value |", "|---|---|"]
        lines += [f"| {escape_md(k)} | {'-' if v is None else f'{v:.4g}'} |" for k, v in s["signals"].items()]
        lines.append("")
    end_ms = parse_rfc3339_ms(w["end"])
    for inc in doc["incidents"]:
        data = (assemble_one(inc) if assemble_one is not None
                else assemble_incident(store, inc, now_ms=end_ms, rules=rules, source=doc["source"]))
        # charts are files; in a terminal the evidence table's sparklines stand in for them
        lines += ["---", "", render_markdown(data), ""]
    return "\n".join(lines).rstrip() + "\n"
