"""The compare document for people: a terminal table, and Markdown with one before/after chart per signal.

The configuration difference heads both, then the SLO block (the objectives, attainment and goodput
before -> after), then the verdict and its reasons, then one row per signal (before, after, change,
significant, better), then the model's prediction for the change beside what was measured. Charts draw each signal's per-interval values of
both windows on one time axis, the stretch between them (the change, the restart) shaded.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms
from vllm_sentinel.reports.charts import CHARTS_MISSING, chart_data, chart_filename, charts_available, draw_chart
from vllm_sentinel.reports.mdescape import escape_md

VERDICT_STYLE = {"improved": "bold green", "regressed": "bold red", "trade-off": "bold yellow",
                 "no clear change": "yellow"}
# the signals charted in Markdown: goodput and attainment, one per family, the ones the verdict weighs
CHARTED = ("goodput_rps", "slo_attainment", "ttft_p95_seconds", "itl_p95_seconds", "queue_time_p95_seconds", "e2e_p95_seconds",
           "request_rate_per_s", "generation_tokens_per_s", "preemptions_per_s", "kv_cache_usage_ratio",
           "gpu_util_percent", "dram_active_ratio")


def fmt_number(v: float | None, unit: str = "") -> str:
    """A value for a cell: 4 significant digits and its unit; '-' when unknown."""
    if v is None:
        return "-"
    return f"{v:.4g}{' ' + unit if unit and unit != 'ratio' else ''}"


def fmt_delta(v: float | None) -> str:
    """'+12.5%', or '-' when the change has no finite per cent (from zero)."""
    return "-" if v is None else f"{v:+.1f}%"


def _yes_no(v: bool | None) -> str:
    return "-" if v is None else "yes" if v else "no"


def config_lines(doc: dict) -> list[str]:
    """'--max-num-seqs 4 -> 3 (at ...)' for each configuration change."""
    return [f"{c['param']} {c['before'] or '-'} -> {c['after'] or '-'}" + (f" (at {c['at']})" if c.get("at") else "")
            for c in doc["config_changes"]]


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.3g}%"


def _seconds(s: float) -> str:
    return f"{s:g} s" if s >= 1 else f"{s * 1000:g} ms"


def slo_lines(doc: dict) -> list[str]:
    """The SLO block in words: the objectives, then attainment and goodput before -> after; [] without one."""
    slo = doc.get("slo")
    if not slo:
        return []
    att, good = slo["attainment"], slo["goodput_rps"]
    return [f"TTFT p95 < {_seconds(slo['ttft_p95_s'])}, TPOT p95 < {_seconds(slo['tpot_p95_s'])}",
            f"attainment {_share(att['before'])} -> {_share(att['after'])}; goodput "
            f"{fmt_number(good['before'])} -> {fmt_number(good['after'])} requests/s"]


def headline(doc: dict) -> str:
    """The first line: what is compared with what."""
    w = doc["window"]
    insts = " vs ".join(doc["instances"])
    return (f"{insts}: before {w['before']['start']} .. {w['before']['end']}, "
            f"after {w['after']['start']} .. {w['after']['end']}")


def render_compare(console: Console, doc: dict) -> None:
    """The compare document as terminal text: configuration changes, verdict, signals table, incidents."""
    console.print(escape(headline(doc)), highlight=False)
    change = doc["window"].get("change")
    if change:
        console.print(escape(f"{change['kind']} at {change['at']}"), highlight=False)
    lines = config_lines(doc)
    console.print("[bold]configuration:[/] " + (escape("; ".join(lines)) if lines else "no difference recorded"),
                  highlight=False)
    slo = slo_lines(doc)
    if slo:
        console.print(f"[bold]SLO:[/] {escape(slo[0])}", highlight=False)
        console.print(f"  {escape(slo[1])}", highlight=False)
    style = VERDICT_STYLE.get(doc["verdict"], "bold")
    console.print(f"[{style}]verdict: {escape(doc['verdict'])}[/]", highlight=False)
    for reason in doc.get("verdict_reasons") or ["no headline signal changed beyond the noise"]:
        console.print(f"  {escape(reason)}", highlight=False)
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("signal", no_wrap=True)
    for col, justify in ( ("before", "right"), ("after", "right"), ("change", "right"),
                         ("significant", "center"), ("better", "center")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for s in doc["signals"]:
        # the name carries the unit (_seconds, _per_s): cells stay narrow enough for 80 columns
        table.add_row(escape(s["name"]), fmt_number(s["before"]), fmt_number(s["after"]),
                      fmt_delta(s["delta_pct"]), _yes_no(s["significant"]), _yes_no(s["better"]))
    console.print(table)
    inc = doc["incidents"]
    console.print(f"incidents stopped: {escape(', '.join(inc['stopped']) or 'none')}; "
                  f"started: {escape(', '.join(inc['started']) or 'none')}", highlight=False)
    if inc.get("carried_over"):
        console.print(escape(f"carried over into the after window, then resolved: {', '.join(inc['carried_over'])}"),
                      highlight=False)
    load = doc.get("load") or {}
    if load.get("per_request"):
        console.print(f"request rates differ (x{load['ratio']:.2f}): preemptions are compared per finished request",
                      highlight=False)
    if doc["signals"]:
        console.print(escape(f"significance: {doc['signals'][0]['method'].split(',')[0]}"), highlight=False)
    render_prediction(console, doc)


def compare_markdown(doc: dict, chart_dir: Path | None = None) -> str:
    """The compare document as Markdown; with `chart_dir`, one PNG per charted signal written there and linked."""
    lines = [f"# vllm-sentinel compare: {escape_md(doc['verdict'])}", "", escape_md(headline(doc)) + ".", "",
             "## Configuration", ""]
    if doc["config_changes"]:
        lines += ["| param | before | after | at |", "|---|---|---|---|"]
        lines += [f"| {escape_md(c['param'], code=True)} | {escape_md(c['before'] or '-')} | "
                  f"{escape_md(c['after'] or '-')} | {escape_md(c.get('at') or '-')} |" for c in doc["config_changes"]]
    else:
        lines.append("No configuration difference recorded.")
    lines += _slo_markdown(doc)
    reasons = doc.get("verdict_reasons") or ["no headline signal changed beyond the noise"]
    lines += ["", f"## Verdict: {escape_md(doc['verdict'])}", ""] + [f"* {escape_md(r)}" for r in reasons]
    inc = doc["incidents"]
    carried = (f" Carried over into the after window, then resolved: {escape_md(', '.join(inc['carried_over']))}."
               if inc.get("carried_over") else "")
    lines += ["", f"Incidents stopped: {escape_md(', '.join(inc['stopped']) or 'none')}. "
                  f"Started: {escape_md(', '.join(inc['started']) or 'none')}.{carried}", "", "## Signals", "",
              "| signal | before | after | change | significant | better | method |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {escape_md(s['name'])} | {fmt_number(s['before'], s['unit'])} | {fmt_number(s['after'], s['unit'])} | "
              f"{fmt_delta(s['delta_pct'])} | {_yes_no(s['significant'])} | {_yes_no(s['better'])} | "
              f"{escape_md(s['method'])} |" for s in doc["signals"]]
    lines += _prediction_markdown(doc)
    lines += ["", "## Charts", ""] + _chart_lines(doc, chart_dir)
    return "\n".join(lines).rstrip() + "\n"


def _slo_markdown(doc: dict) -> list[str]:
    """The SLO section: objectives, attainment and goodput before and after, and how they were read."""
    if not doc.get("slo"):
        return []
    slo, att, good = doc["slo"], doc["slo"]["attainment"], doc["slo"]["goodput_rps"]
    return ["", "## SLO", "", "Objectives: " + escape_md(slo_lines(doc)[0]) + ".", "",
            "| | before | after |", "|---|---|---|",
            f"| SLO attainment | {_share(att['before'])} | {_share(att['after'])} |",
            f"| goodput (requests/s) | {fmt_number(good['before'])} | {fmt_number(good['after'])} |", "",
            f"Method: {escape_md(slo['method'])}."]


def _chart_lines(doc: dict, chart_dir: Path | None) -> list[str]:
    """Links to the charts drawn into `chart_dir`, or the one line saying why there are none."""
    if chart_dir is None:
        return ["Charts: pass --out DIR to draw them."]
    if not charts_available():
        return [escape_md(CHARTS_MISSING)]
    chart_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for data in compare_charts(doc):
        path = draw_chart(data, chart_dir / chart_filename(data["signal"]))
        out += [f"![{escape_md(data['signal'])}]({path.name})", ""]
    return out or ["No signal to chart."]


def compare_charts(doc: dict) -> list[dict]:
    """The chart data (reports/charts.py `chart_data`) of each charted signal: before and after as two lines."""
    w = doc["window"]
    span = (parse_rfc3339_ms(w["before"]["start"]), parse_rfc3339_ms(w["after"]["end"]))
    between = (parse_rfc3339_ms(w["before"]["end"]), parse_rfc3339_ms(w["after"]["start"]))
    units = {s["name"]: s["unit"] for s in doc["signals"]}
    out = []
    for name in CHARTED:
        sides = (doc.get("intervals") or {}).get(name)
        if not sides:
            continue
        series = [({"window": side}, [(int(t), v) for t, v in sides[side]]) for side in ("before", "after")]
        out.append(chart_data(name, series, window_ms=span, incident_ms=between, unit=units.get(name, ""),
                              description="per interval; shaded: between the windows (the change)"))
    return out


def prediction_head(doc: dict) -> str | None:
    """The prediction block's first line: what was predicted from what, and whether it held; None without one."""
    p = doc.get("prediction")
    if not p:
        return None
    what = "; ".join(p.get("changes") or []) or "the change"
    if p.get("withheld"):
        return f"prediction for {what}: withheld: {p['withheld']}"
    said = f"predicted from the before window alone for {what}, beside what the after window measured: "
    if p.get("unjudged"):
        return said + f"not judged: {p['unjudged']}"
    held = "within" if p.get("within_bound") else "outside"
    return said + f"{held} the model's {p.get('bound', 0.3):.0%} bound"


def render_prediction(console: Console, doc: dict) -> None:
    """compare's prediction block: each signal predicted before the change beside the measurement, and the error."""
    head = prediction_head(doc)
    if head is None:
        return
    # the title on a line of its own: a table title wraps at the table's narrow width
    console.print(escape(head), highlight=False)
    rows = doc["prediction"].get("rows") or []
    if rows:
        table = Table(show_edge=False, pad_edge=False)
        for col, justify in (("signal", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in rows:
            table.add_row(escape(r["signal"]), fmt_number(r["predicted"]), fmt_number(r["measured"]), _error(r["error"]))
        console.print(table)
    for note in doc["prediction"].get("notes") or []:
        console.print(f"  {escape(note)}", highlight=False)


def _prediction_markdown(doc: dict) -> list[str]:
    """The Prediction section: the same block as Markdown."""
    head = prediction_head(doc)
    if head is None:
        return []
    out = ["", "## Prediction", "", escape_md(head) + "."]
    rows = doc["prediction"].get("rows") or []
    if rows:
        out += ["", "| signal | predicted | measured | error |", "|---|---|---|---|"]
        out += [f"| {escape_md(r['signal'])} | {fmt_number(r['predicted'])} | {fmt_number(r['measured'])} | "
                f"{_error(r['error'])} |" for r in rows]
    out += [""] + [f"* {escape_md(n)}" for n in doc["prediction"].get("notes") or []]
    return out


def _error(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"
