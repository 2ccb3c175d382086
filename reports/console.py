"""Terminal rendering (rich) of the diagnose document and the daemon status."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vllm_sentinel.reports.sparkline import sparkline

SEVERITY_STYLE = {"critical": "bold red", "high": "red", "warning": "yellow", "info": "cyan"}

# summary columns shown in the table: (signal, header, format)
SUMMARY_COLUMNS = [
    ("request_rate_per_s", "req/s", "{:.2f}"),
    ("prompt_tokens_per_s", "prompt tok/s", "{:.1f}"),
    ("generation_tokens_per_s", "gen tok/s", "{:.1f}"),
    ("ttft_p50_seconds", "TTFT p50", "{:.3f}s"),
    ("ttft_p95_seconds", "TTFT p95", "{:.3f}s"),
    ("itl_p95_seconds", "ITL p95", "{:.3f}s"),
    ("queue_time_p95_seconds", "queue p95", "{:.3f}s"),
    ("kv_cache_usage_peak", "KV peak", "{:.0%}"),
    ("preemptions", "preempt", "{:.0f}"),
]


def fmt_value(value: float | None, pattern: str) -> str:
    """A number for a table cell; '-' when unknown."""
    return "-" if value is None else pattern.format(value)


def render_diagnosis(console: Console, doc: dict, fmt: str = "table") -> None:
    """Print incidents first (what to act on), then the per-instance health summary."""
    w = doc["window"]
    console.print(f"[bold]vllm-sentinel diagnose[/]  {w['start']} .. {w['end']}  source {doc['source']}",
                  highlight=False)
    incidents = doc.get("incidents", [])
    if incidents:
        t = Table(title=f"{len(incidents)} incident(s)", title_justify="left")
        for col in ("severity", "incident", "instance", "started", "state", "summary", "first fix"):
            t.add_column(col, overflow="fold")
        for i in incidents:
            fix = (i.get("fixes") or [{}])[0]
            first_fix = f"{fix.get('param', '')} {fix.get('current', '')} -> {fix.get('suggested', '')}".strip() \
                if fix else ""
            sev = i.get("severity", "")
            t.add_row(f"[{SEVERITY_STYLE.get(sev, '')}]{sev}[/]", i.get("incident", ""), i.get("instance", ""),
                      i.get("start", ""), i.get("state", ""), i.get("summary", ""), first_fix)
        console.print(t)
    else:
        console.print("[green]no incidents in this window[/]")
    summary = doc.get("summary", [])
    if summary:
        t = Table(title="health per instance", title_justify="left")
        t.add_column("instance")
        t.add_column("scrapes ok")
        for _key, header, _f in SUMMARY_COLUMNS:
            t.add_column(header, justify="right")
        for s in summary:
            sig = s["signals"]
            scrapes, ok = sig.get("scrapes"), sig.get("scrapes_ok")
            health = f"{ok:.0f}/{scrapes:.0f}" if scrapes else "-"
            t.add_row(s["instance"], health, *[fmt_value(sig.get(k), f) for k, _h, f in SUMMARY_COLUMNS])
        console.print(t)
        for s in summary:
            trends = s.get("trends") or {}
            if any(v is not None for vs in trends.values() for v in vs):
                t = Table(title=f"{s['instance']} over the window", title_justify="left", show_header=True)
                t.add_column("signal")
                t.add_column("trend")
                t.add_column("peak", justify="right")
                for key, values in trends.items():
                    present = [v for v in values if v is not None]
                    if not present:
                        continue
                    t.add_row(key, sparkline(values), f"{max(present):.3g}")
                console.print(t)
            if s.get("last_error"):
                console.print(f"[yellow]{s['instance']}[/]: last scrape error: {s['last_error']}", highlight=False)


def render_status(console: Console, doc: dict) -> None:
    """One line per collector: ok or failing, and why."""
    console.print(f"daemon on {doc['db']} every {doc['interval_s']:g}s (queue {doc['queue']})", highlight=False)
    t = Table()
    for col in ("collector", "state", "error / detail"):
        t.add_column(col, overflow="fold")
    for c in doc["collectors"]:
        state = "[green]ok[/]" if c["ok"] else "[red]failing[/]"
        t.add_row(c["name"], state, c.get("error") or ", ".join(f"{k}={v}" for k, v in (c.get("detail") or {}).items()))
    console.print(t)
