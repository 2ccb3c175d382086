"""The full Markdown of a diagnose document: the window's health, its episodes (root causes first,
the incidents they explain beneath), then one report per incident."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_sentinel.agent.diagnosis.episodes import episodes_of, explaining
from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms
from vllm_sentinel.reports.assemble import assemble_incident
from vllm_sentinel.reports.console import fix_line
from vllm_sentinel.reports.markdown import ReportData, render_markdown, utc
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
    lines += episodes_markdown(doc["incidents"])
    end_ms = parse_rfc3339_ms(w["end"])
    for inc in doc["incidents"]:
        data = (assemble_one(inc) if assemble_one is not None
                else assemble_incident(store, inc, now_ms=end_ms, rules=rules, source=doc["source"]))
        # charts are files; in a terminal the evidence table's sparklines stand in for them
        lines += ["---", "", render_markdown(data), ""]
    return "\n".join(lines).rstrip() + "\n"


def _incident_line(inc: dict) -> str:
    start = utc(parse_rfc3339_ms(inc["start"]), with_date=False)
    end = utc(parse_rfc3339_ms(inc["end"]), with_date=False) if inc.get("end") else "still firing"
    return (f"{escape_md(inc.get('incident', '?'), code=True)} ({escape_md(inc.get('id', '?'), code=True)}, "
            f"{escape_md(inc.get('severity') or '')}, {start} .. {end}): {escape_md(inc.get('summary') or '')}")


def episodes_markdown(incidents: list[dict]) -> list[str]:
    """## Episodes: per episode its root causes with their first fix, then the incidents they explain."""
    if not incidents:
        return []
    out = ["## Episodes", "", "Incidents of one instance that overlap in time form an episode: fix its root causes "
           "first; the incidents beneath them are what those causes explain.", ""]
    for episode in episodes_of(incidents):
        roots = [i for i in episode if not i.get("caused_by")]
        out += [f"### Episode {escape_md(episode[0].get('episode') or '-', code=True)} on "
                f"{escape_md(episode[0].get('instance') or '?')}: {len(roots)} root cause(s), "
                f"{len(episode) - len(roots)} explained", ""]
        for inc in roots:
            out.append(f"- **root** {_incident_line(inc)}")
            out += [f"  - fix: {escape_md(fix_line(f), code=True)}" for f in (inc.get("fixes") or [])[:1]]
        for inc in episode:
            if inc.get("caused_by"):
                causes = ", ".join(f"{escape_md(name, code=True)} ({escape_md(cid, code=True)})"
                                   for name, cid in explaining(inc, incidents))
                out += [f"- {_incident_line(inc)}", f"  - explained by {causes}"]
        out.append("")
    return out
