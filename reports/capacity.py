"""Rendering of capacity's document: the headline sentences, a terminal table, Markdown, the chart's data."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vllm_sentinel.reports.console import fmt_value
from vllm_sentinel.reports.mdescape import escape_md

CHART_NAME = "capacity-load-latency.png"

# level rows: (key, column, format); first the load a level carried
LOAD_COLUMNS = [
    ("request_rate_per_s", "req/s", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.0f}"),
    ("running_mean", "running", "{:.1f}"),
    ("littles_law_concurrency", "L=λW", "{:.1f}"),
]
# then its latency: p95s from each level's summed histogram buckets
LATENCY_COLUMNS = [
    ("ttft_p95_seconds", "TTFT p95", "{:.2f}s"),
    ("tpot_p95_seconds", "TPOT p95", "{:.3f}s"),
    ("queue_time_p95_seconds", "queue p95", "{:.2f}s"),
]
# and last how many requests the level's figures stand on
LEVEL_COLUMNS = LOAD_COLUMNS + LATENCY_COLUMNS + [("requests", "n", "{:.0f}")]
# an 80-column terminal holds these; Markdown has them all
CONSOLE_COLUMNS = [c for c in LEVEL_COLUMNS if c[0] not in ("tokens_per_s", "queue_time_p95_seconds")]


def _n(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.3g}{unit}"


def headline(doc: dict) -> list[str]:
    """The sentences an operator reads first: objectives, coverage, SLO point, knee, replicas, routing."""
    o = doc["objectives"]
    lines = [f"Objectives: TTFT p95 <= {_n(o['ttft_p95_seconds'], ' s')}, TPOT p95 <= "
             f"{_n(o['tpot_p95_seconds'], ' s')} ({o['source']}).",
             f"Coverage: {doc['coverage']['statement']}."]
    slo = doc["slo_point"]
    if slo is None:
        lines.append("SLO point: none: the lowest judged load level already missed an objective (see the levels).")
    else:
        m = slo["margin"]
        lines.append(
            f"SLO point: {_n(slo['request_rate_per_s'])} requests/s per instance ({_n(slo['tokens_per_s'])} tokens/s), "
            f"TTFT p95 {_n(slo['ttft_p95_seconds'], ' s')} ({_n(m['ttft_pct'], '%')} margin), TPOT p95 "
            f"{_n(slo['tpot_p95_seconds'], ' s')} ({_n(m['tpot_pct'], '%')} margin); Little's law concurrency "
            f"{_n(slo['littles_law_concurrency'])} (running mean {_n(slo['running_mean'])})."
            + (" No level missed the objectives: this is the top of the history, a lower bound of capacity."
               if slo["bounded_by_history"] else
               f" The next level ({_n(slo['next_level']['request_rate_per_s'])}/s) missed: "
               f"{', '.join(slo['next_level']['missed'])}."))
    k = doc["knee"]
    lines.append("Knee: none within the history." if k is None else
                 f"Knee: {_n(k['request_rate_per_s'])} requests/s, where {k['signal']} reached {_n(k['value'], ' s')} "
                 f"({_n(k['factor'])}x the {_n(k['baseline'], ' s')} at {_n(k['baseline_rate_per_s'])}/s).")
    r = doc["replicas"]
    if r is not None:
        lines.append(f"Replicas for {_n(r['target_rate_per_s'])} requests/s: "
                     + ("none computable" if r["replicas"] is None else
                        f"{r['replicas']} at {_n(r['per_replica_rate_per_s'])}/s each")
                     + (" (EXTRAPOLATED)" if r["extrapolated"] else "")
                     + (f". {r['warning']}." if r["warning"] else "."))
    route = doc["routing"]
    if route is not None:
        lines.append(f"Routing: prompts are bimodal: {route['summary']}. {route['effect']}.")
    return lines


def render_capacity(console: Console, doc: dict) -> None:
    """capacity's document as a terminal table: the headline, then one row per load level."""
    for line in headline(doc):
        console.print(escape(line), highlight=False)
    table = Table(title=f"load levels ({doc['bin_seconds']:g} s bins, per instance)", title_justify="left")
    for _, column, _ in CONSOLE_COLUMNS:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("SLO", no_wrap=True)
    for lv in doc["levels"]:
        table.add_row(*[fmt_value(lv.get(k), f) for k, _, f in CONSOLE_COLUMNS], _verdict(lv, doc))
    console.print(table)


def _verdict(level: dict, doc: dict) -> str:
    if not level["judged"]:
        return "n too small"
    o = doc["objectives"]
    missed = [name for key, name in (("ttft_p95_seconds", "TTFT"), ("tpot_p95_seconds", "TPOT"))
              if level.get(key) is not None and level[key] > o[key]]
    return "miss " + "+".join(missed) if missed else "met"


def capacity_markdown(doc: dict, chart: str | None = None) -> str:
    """capacity's document as Markdown: headline, the load-latency chart (when drawn), the levels table."""
    lines = [f"# vllm-sentinel capacity, {escape_md(doc['window']['start'])} .. {escape_md(doc['window']['end'])}", "",
             f"Source: {escape_md(doc['source'], code=True)}. Instances: "
             f"{', '.join(escape_md(i) for i in doc['instances'])}.", ""]
    lines += [f"* {escape_md(line)}" for line in headline(doc)] + [""]
    if chart:
        lines += [f"![load vs latency]({chart})", ""]
    lines += ["## Load levels", "", "| " + " | ".join(c for _, c, _ in LEVEL_COLUMNS) + " | SLO |",
              "|" + "---|" * (len(LEVEL_COLUMNS) + 1)]
    for lv in doc["levels"]:
        lines.append("| " + " | ".join(fmt_value(lv.get(k), f) for k, _, f in LEVEL_COLUMNS)
                     + f" | {_verdict(lv, doc)} |")
    lines += ["", "Methods:", ""] + [f"* {escape_md(k)}: {escape_md(v)}" for k, v in doc["methods"].items()]
    if doc["routing"] is not None:
        lines += ["", "## Length-based routing", "", escape_md(doc["routing"]["method"]) + "."]
    return "\n".join(lines).rstrip() + "\n"


def load_latency_data(doc: dict) -> dict:
    """The chart's data: per-bin and per-level (rate, p95) points for TTFT and TPOT, the objectives, marks."""
    def points(rows: list[dict], key: str) -> list[list[float]]:
        return [[r["request_rate_per_s"], r[key]] for r in rows if r.get(key) is not None]
    slo, knee = doc["slo_point"], doc["knee"]
    return {
        "panels": [{"signal": key, "title": title, "objective": doc["objectives"][key],
                    "bins": points(doc["bins"], key), "levels": points(doc["levels"], key)}
                   for key, title in (("ttft_p95_seconds", "TTFT p95"), ("tpot_p95_seconds", "TPOT p95"))],
        "slo_point_rate": None if slo is None else slo["request_rate_per_s"],
        "knee_rate": None if knee is None else knee["request_rate_per_s"],
        "title": f"load vs latency, {doc['bin_seconds']:g} s bins per instance",
    }
