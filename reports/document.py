"""The full Markdown of a diagnose document: the window's health, then one report per incident."""

from __future__ import annotations

from typing import Any

from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms
from vllm_sentinel.reports.assemble import assemble_incident
from vllm_sentinel.reports.markdown import render_markdown


def diagnose_markdown(store: Any, doc: dict, rules: list | None = None) -> str:
    """The full Markdown of a diagnose document: the window's health, then one report per incident."""
    w = doc["window"]
    lines = [f"# vllm-sentinel diagnosis, {w['start']} .. {w['end']}", "",
             f"Source: `{doc['source']}`. Instances: {', '.join(doc['instances'])}. "
             f"Incidents: {len(doc['incidents'])}.", ""]
    for s in doc.get("summary", []):
        lines += [f"## Health of {s['instance']}", "", "| signal | value |", "|---|---|"]
        lines += [f"| {k} | {'-' if v is None else f'{v:.4g}'} |" for k, v in s["signals"].items()]
        lines.append("")
    end_ms = parse_rfc3339_ms(w["end"])
    for inc in doc["incidents"]:
        data = assemble_incident(store, inc, now_ms=end_ms, rules=rules, source=doc["source"])
        # charts are files; in a terminal the evidence table's sparklines stand in for them
        lines += ["---", "", render_markdown(data), ""]
    return "\n".join(lines).rstrip() + "\n"
