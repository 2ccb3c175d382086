"""Terminal rendering (rich) of the diagnose document and the daemon status.

Built to be read at 3 a.m. in an 80-column terminal: incidents first, one block each (what,
where, when, the sentence to act on, the first fix), grouped by episode with the root causes
first and their symptoms beneath, then health per instance as rows of signals.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vllm_sentinel.agent.diagnosis.episodes import episodes_of, explaining
from vllm_sentinel.collectors.timefmt import iso_seconds
from vllm_sentinel.reports.sparkline import sparkline

SEVERITY_STYLE = {"critical": "bold white on red", "high": "bold red", "warning": "yellow", "info": "cyan"}

# health rows: (signal, label, format)
SUMMARY_ROWS = [
    ("scrapes_ok", "scrapes ok", "{:.0f}"),
    ("request_rate_per_s", "requests/s", "{:.2f}"),
    ("prompt_tokens_per_s", "prompt tokens/s", "{:.1f}"),
    ("generation_tokens_per_s", "generated tokens/s", "{:.1f}"),
    ("ttft_p50_seconds", "TTFT p50", "{:.3f} s"),
    ("ttft_p95_seconds", "TTFT p95", "{:.3f} s"),
    ("itl_p95_seconds", "inter-token p95", "{:.3f} s"),
    ("queue_time_p50_seconds", "queue time p50", "{:.3f} s"),
    ("queue_time_p95_seconds", "queue time p95", "{:.3f} s"),
    ("e2e_p95_seconds", "end-to-end p95", "{:.3f} s"),
    ("kv_cache_usage_peak", "KV cache peak", "{:.0%}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("running_peak", "running peak", "{:.0f}"),
    ("waiting_peak", "waiting peak", "{:.0f}"),
    ("gpu_util_avg_percent", "GPU util avg", "{:.0f} %"),
    ("gpu_fb_used_peak_mib", "GPU memory peak", "{:.0f} MiB"),
]


def fmt_value(value: float | None, pattern: str) -> str:
    """A number for a table cell; '-' when unknown."""
    return "-" if value is None else pattern.format(value)


def _clock(iso: str | None, day: str) -> str:
    """'2026-11-29T10:00:05Z' -> '10:00:05' when on `day`, else the date too."""
    if not iso:
        return "now"
    return iso[11:19] if iso[:10] == day else iso.replace("T", " ").rstrip("Z")


def fix_line(fix: dict) -> str:
    """'--max-num-seqs 256 -> 128' for a value change, the advice itself when there is no value."""
    param, cur, new = fix.get("param", ""), fix.get("current"), fix.get("suggested")
    if cur in (None, "", "None"):
        return f"{param}: {new}" if new else param
    return f"{param} {cur} -> {new}"


def predicted_line(p: dict) -> str:
    """'predicted: goodput 0.95 req/s, TTFT p95 0.6 s, 0 preemptions/s' (and the trade, where there is one)."""
    def n(key: str) -> str:
        return "-" if p.get(key) is None else f"{p[key]:.3g}"
    line = f"predicted: goodput {n('goodput_rps')} req/s, TTFT p95 {n('ttft_p95_s')} s, {n('preemptions_per_s')} preemptions/s"
    return line + (f"; trade: {p['trade']}" if p.get("trade") else "")


def explained_by(inc: dict, incidents: list[dict]) -> str:
    """'kv_cache_pressure c06a4ef9cd12, traffic_burst 5119cacc4f2a' for an incident's `caused_by` ids."""
    return ", ".join(f"{name} {cid[:12]}" for name, cid in explaining(inc, incidents))


def _render_incident(console: Console, inc: dict, day: str, incidents: list[dict]) -> None:
    """One incident's block; a symptom is indented under its episode's root, marked with what explains it."""
    sev = inc.get("severity", "")
    symptom = bool(inc.get("caused_by"))
    pad = "      " if symptom else "   "
    head = Text("   - " if symptom else "")
    head.append(f" {sev.upper()} ", style=SEVERITY_STYLE.get(sev, "bold"))
    head.append(f" {inc.get('incident', '')} ", style="bold")
    head.append(f"{inc.get('instance', '')}  ")
    lasted = f" ({inc['duration_s']:g} s)" if inc.get("duration_s") is not None else ""
    head.append(f"{_clock(inc.get('start'), day)} -> {_clock(inc.get('end'), day)}{lasted}  {inc.get('state', '')}",
                style="dim")
    console.print(head)
    console.print(Text(f"{pad}{inc.get('summary', '')}"))
    fixes = inc.get("fixes") or []
    if symptom:
        # its own fixes stay in the JSON and its report: the cause's fix comes first
        console.print(Text(f"{pad}explained by {explained_by(inc, incidents)}", style="yellow"))
    elif fixes:
        inferred = str(fixes[0].get("current_source") or "").startswith("inferred")
        console.print(Text(f"{pad}fix: {fix_line(fixes[0])}" + ("  (current value inferred from the metrics)"
                                                                if inferred else ""), style="green"))
        predicted = fixes[0].get("predicted")
        if predicted:
            console.print(Text(f"{pad}     {predicted_line(predicted)}", style="green"))
    # an incident read from Prometheus carries the command that evaluates its window again
    report = inc.get("report") or f"vllm-sentinel report {inc.get('id', '')[:12]}"
    console.print(Text(f"{pad}id {inc.get('id', '')}  ({report})", style="dim"))


def render_incidents(console: Console, incidents: list[dict], day: str) -> None:
    """One block per incident, by episode: its root causes with their fixes, the symptoms beneath them."""
    episodes = episodes_of(incidents)
    console.print(Text(f"{len(incidents)} incident(s) in {len(episodes)} episode(s)", style="bold"))
    for episode in episodes:
        if len(episode) > 1:
            roots = [i for i in episode if not i.get("caused_by")]
            console.print(Text(f"episode {str(episode[0].get('episode', ''))[:12]} on {episode[0].get('instance', '')}: "
                               f"{len(roots)} root cause(s), {len(episode) - len(roots)} explained", style="bold"))
        for inc in episode:
            _render_incident(console, inc, day, incidents)


def render_diagnosis(console: Console, doc: dict, fmt: str = "table") -> None:
    """Print incidents first (what to act on), then the per-instance health summary."""
    w = doc["window"]
    console.print(Text(f"vllm-sentinel diagnose  {w['start']} .. {w['end']}", style="bold"))
    console.print(Text(f"source {doc['source']}", style="dim"))
    day = w["end"][:10]
    incidents = doc.get("incidents", [])
    if incidents:
        render_incidents(console, incidents, day)
    else:
        console.print(Text("no incidents in this window", style="green"))
    summary = doc.get("summary", [])
    if not summary:
        return
    t = Table(title="health over the window", title_justify="left")
    t.add_column("signal")
    for s in summary:
        t.add_column(escape(s["instance"]), justify="right")  # scraped text: never rich markup
    for key, label, pattern in SUMMARY_ROWS:
        values = [s["signals"].get(key) for s in summary]
        if key == "scrapes_ok":
            cells = [f"{fmt_value(s['signals'].get('scrapes_ok'), '{:.0f}')}/"
                     f"{fmt_value(s['signals'].get('scrapes'), '{:.0f}')}" for s in summary]
        elif all(v is None for v in values):
            continue  # a signal nobody exports (no GPU, old vLLM): not a row of dashes
        else:
            cells = [fmt_value(v, pattern) for v in values]
        t.add_row(label, *cells)
    console.print(t)
    for s in summary:
        trends = s.get("trends") or {}
        if any(v is not None for vs in trends.values() for v in vs):
            t = Table(title=f"{escape(s['instance'])} over the window", title_justify="left")
            t.add_column("signal")
            t.add_column("trend", no_wrap=True)
            t.add_column("peak", justify="right")
            for key, values in trends.items():
                present = [v for v in values if v is not None]
                if present:
                    t.add_row(escape(key), sparkline(values), f"{max(present):.3g}")
            console.print(t)
        if s.get("last_error"):
            console.print(Text(f"{s['instance']}: last scrape error: {s['last_error']}", style="yellow"))


def render_status(console: Console, doc: dict) -> None:
    """One line per collector: ok, degraded (scraped but not all stored) or failing, and why."""
    console.print(Text(f"daemon on {doc['db']} every {doc['interval_s']:g}s (queue {doc['queue']})"))
    store = doc.get("store") or {}
    if not store.get("ok", True):
        console.print(Text(f"store failing: {store.get('error')} ({store.get('held_batches', 0)} batches held "
                           "in memory)", style="bold red"))
    if store.get("lost_batches"):
        console.print(Text(f"store: {store['lost_batches']} batches dropped while it could not write",
                           style="yellow"))
    _render_targets(console, doc)
    t = Table()
    for col in ("collector", "state", "error / detail"):
        t.add_column(col, overflow="fold")
    for c in doc["collectors"]:
        state = c.get("state") or ("ok" if c["ok"] else "failing")
        state = {"ok": "[green]ok[/]", "degraded": "[yellow]degraded[/]"}.get(state, "[red]failing[/]")
        detail = c.get("error") or ", ".join(f"{k}={v}" for k, v in (c.get("detail") or {}).items())
        t.add_row(Text(c["name"]), state, Text(detail))  # errors quote scraped text: never rich markup
    console.print(t)
    if doc.get("cpu"):  # the daemon's CPU budget: use, stretch, deferred work
        over = doc["cpu"].get("used", 0) > doc["cpu"].get("budget", 1)
        console.print(Text(doc["cpu"]["summary"], style="yellow" if over else ""))
    for path in doc.get("reports") or []:
        console.print(Text(f"report: {path}"))
    for name, line in (doc.get("captures") or {}).items():
        console.print(Text(f"last capture of {name}: {line}"))
    for url, sent in (doc.get("alertmanager") or {}).items():
        line = f"alertmanager {url}: {sent['sent']} alerts sent, {sent['failed']} failed, {sent['dropped']} dropped"
        if sent.get("last_error"):
            line += f"; last error: {sent['last_error']}"
        console.print(Text(line, style="yellow" if sent.get("last_error") else ""))


def _render_targets(console: Console, doc: dict) -> None:
    """Where the targets came from; the targets file's last reload, or why the last one failed."""
    targets = doc.get("targets") or []
    from_flag = sum(1 for t in targets if t.get("source") == "--target")
    tf = doc.get("targets_file")
    line = f"targets: {from_flag} from --target"
    if tf:
        line += f", {len(targets) - from_flag} from {tf['path']}"
        if tf.get("last_reload_ms"):
            line += f" (read {iso_seconds(tf['last_reload_ms'])}"
            line += f", last change {iso_seconds(tf['last_change_ms'])})" if tf.get("last_change_ms") else ")"
    console.print(Text(line))
    if tf and tf.get("error"):
        console.print(Text(f"targets file reload failed, the running targets stay: {tf['error']}", style="bold red"))


def render_capture(console: Console, doc: dict) -> None:
    """Per process: where it is (class shares, hot frames); stopped processes said so."""
    console.print(Text(f"stacks of {doc['instance']} ({doc['target']}): {doc['status']}", style="bold"))
    for p in doc["processes"]:
        head = f"{p['role']} pid {p['pid']}"
        if p.get("stopped"):
            head += "  STOPPED (SIGSTOP or a debugger): these stacks are where it is frozen"
        console.print(Text(head, style="bold red" if p.get("stopped") else "bold"))
        if p["status"] not in ("ok", "truncated"):
            console.print(Text(f"   {p['status']}: {p.get('error')}", style="yellow"))
            continue
        shares = ", ".join(f"{c} {v:.0%}" for c, v in (p.get("busy_shares") or p.get("class_shares") or {}).items())
        console.print(Text(f"   {p.get('samples', 0)} samples; {shares or 'idle'}"))
        for f in (p.get("top_frames") or [])[:5]:
            console.print(Text(f"   {f['samples']:>5}  [{f['class']}] {f['frame']}", style="dim"))
    if doc.get("profiler"):
        t = doc["profiler"]
        if t["status"] == "ok":
            where = t.get("artifact") or "where the server's profiler config says (not readable here)"
            n = len(t.get("files") or [])
            files = f" ({n} file{'' if n == 1 else 's'})" if n else ""
            console.print(Text(f"vLLM profiler ({t['kind']}, {t['duration_ms'] / 1000:.1f} s): trace in {where}{files}"))
        else:
            console.print(Text(f"vLLM profiler ({t['kind']}) not taken, {t['status']}: {t.get('error')}", style="yellow"))
    if doc.get("stored_in"):
        console.print(Text(f"stored in {doc['stored_in']}", style="dim"))
