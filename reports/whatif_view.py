"""The whatif document for people: the model's calibration against the window, then one column per scenario.

The calibration comes first because it decides whether the predictions may be read at all: each
judged figure measured, modelled and the error, and the reason when predictions are withheld.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vllm_sentinel.reports.compare_view import fmt_number
from vllm_sentinel.reports.mdescape import escape_md

# (key in a prediction, label with unit)
ROWS = (("ttft_p50_s", "TTFT p50 s"), ("ttft_p95_s", "TTFT p95 s"), ("itl_p95_s", "inter-token p95 s"),
        ("tpot_p95_s", "TPOT p95 s (per request)"), ("queue_p95_s", "queue p95 s"), ("e2e_p95_s", "e2e p95 s"),
        ("preemptions_per_s", "preemptions/s"), ("requests_per_s", "requests/s"),
        ("generation_tokens_per_s", "generated tokens/s"), ("goodput_rps", "goodput req/s"),
        ("slo_attainment", "SLO attainment"))
JUDGED_LABELS = {"ttft_p95_s": "TTFT p95 s", "itl_p95_s": "inter-token p95 s", "preemptions_per_s": "preemptions/s",
                 "generation_tokens_per_s": "generated tokens/s"}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def headline(doc: dict) -> str:
    """What was modelled: instance, window, workload in one line."""
    w, load = doc["window"], doc["workload"]
    clients = f", {load['clients']} clients" if load.get("clients") else ""
    return (f"{doc['instance']}: {w['start']} .. {w['end']}; {load['requests']:g} requests ({load['mode']}{clients}), "
            f"prompts {load['prompt_tokens_mean']:g} and outputs {load['output_tokens_mean']:g} tokens on average")


FRONTEND_NOTE_S = 0.2  # a frontend holding requests this long on average is said beside the calibration


def frontend_note(doc: dict) -> str | None:
    """The line that says the API server held requests outside vLLM's e2e, which the model leaves out."""
    held = doc["workload"].get("frontend_s")
    if held is None or held < FRONTEND_NOTE_S:
        return None
    return (f"the API server held each generation request {held:.2g} s on average before or after the engine "
            "(its HTTP handler's time minus vLLM's e2e): a CPU-starved frontend, which the model leaves out; "
            "its latencies are the engine's")


def notes(doc: dict) -> list[str]:
    """The calibration's notes, then the frontend's."""
    return doc["calibration"].get("notes", []) + [n for n in (frontend_note(doc),) if n]


def objectives_line(doc: dict) -> str:
    """'objectives: TTFT p95 2 s, TPOT p95 0.1 s (...)'."""
    o = doc["objectives"]
    return f"objectives: TTFT p95 {o['ttft_p95_s']:g} s, TPOT p95 {o['tpot_p95_s']:g} s ({o['source']})"


def render_whatif(console: Console, doc: dict) -> None:
    """The whatif document as terminal text."""
    console.print(escape(headline(doc)), highlight=False)
    console.print(escape(objectives_line(doc)), highlight=False)
    cal = doc["calibration"]
    table = Table(title="the model's replay of the window", show_edge=False, pad_edge=False, title_justify="left")
    for col, justify in (("signal", "left"), ("measured", "right"), ("modelled", "right"), ("error", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for key, label in JUDGED_LABELS.items():
        table.add_row(label, fmt_number(cal["measured"].get(key)), fmt_number(cal["modelled"].get(key)),
                      _pct(cal["error"].get(key)))
    console.print(table)
    console.print(escape(f"step time: {cal['step_time']['base_s'] * 1000:.3g} ms + "
                         f"{cal['step_time']['per_token_s'] * 1e6:.3g} µs per token, from {cal['step_time']['fitted_from']}"),
                  highlight=False)
    for note in notes(doc):
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if doc["withheld"]:
        console.print(f"[bold yellow]predictions withheld:[/] {escape(doc['withheld'])}", highlight=False)
        return
    scenarios = doc["scenarios"]
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("predicted")
    for sc in scenarios:
        table.add_column(escape(sc["name"]), justify="right")
    for key, label in ROWS:
        fmt = _pct if key == "slo_attainment" else fmt_number
        table.add_row(label, *[fmt((sc["predicted"] or {}).get(key)) for sc in scenarios])
    console.print(table)
    for sc in scenarios[1:]:
        console.print(escape(f"{sc['name']}: {'; '.join(sc['changes'])}"), highlight=False)


def whatif_markdown(doc: dict) -> str:
    """The whatif document as Markdown (every value from the document escaped)."""
    lines = ["# What if", "", escape_md(headline(doc)), "", escape_md(objectives_line(doc)), "",
             "## The model's replay of the window", "", "| signal | measured | modelled | error |", "|---|---:|---:|---:|"]
    cal = doc["calibration"]
    for key, label in JUDGED_LABELS.items():
        lines.append(f"| {label} | {fmt_number(cal['measured'].get(key))} | {fmt_number(cal['modelled'].get(key))} | "
                     f"{_pct(cal['error'].get(key))} |")
    lines.append("")
    for note in notes(doc):
        lines += [f"Note: {escape_md(note)}", ""]
    if doc["withheld"]:
        lines += [f"**Predictions withheld:** {escape_md(doc['withheld'])}", ""]
        return "\n".join(lines)
    scenarios = doc["scenarios"]
    lines += ["## Predictions", "", "| predicted | " + " | ".join(escape_md(s["name"]) for s in scenarios) + " |",
              "|---|" + "---:|" * len(scenarios)]
    for key, label in ROWS:
        fmt = _pct if key == "slo_attainment" else fmt_number
        lines.append(f"| {label} | " + " | ".join(fmt((s["predicted"] or {}).get(key)) for s in scenarios) + " |")
    lines.append("")
    for sc in scenarios[1:]:
        lines.append(f"- **{escape_md(sc['name'])}**: {escape_md('; '.join(sc['changes']))}")
    return "\n".join(lines) + "\n"
