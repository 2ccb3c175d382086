"""One incident report as Markdown, rendered from plain data (no store, no clock, no I/O).

Sections, in the order an operator at 3 a.m. needs them: verdict, timeline, evidence, charts,
configuration at the time, the fix as a before/after `vllm serve` line, stack evidence,
related incidents, and what was not checked.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from vllm_sentinel.agent.diagnosis.episodes import explaining
from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms
from vllm_sentinel.reports.charts import chart_filename
from vllm_sentinel.reports.mdescape import escape_md, escape_md_with_code, fenced
from vllm_sentinel.reports.sparkline import time_sparkline

Point = tuple[int, float | None]
LabeledSeries = tuple[dict[str, str], Sequence[Point]]

SPARK_WIDTH = 24


@dataclass
class ProcessStacks:
    """Stack evidence for one process: its hottest frames and the share of each frame class."""

    role: str  # api_server | engine_core | worker | ...
    pid: int
    kind: str  # dump | record
    ts_ms: int
    samples: int
    top_frames: list[tuple[str, float, str]] = field(default_factory=list)  # (frame, share 0..1, class label)
    class_shares: dict[str, float] = field(default_factory=dict)  # class label -> share 0..1
    status: str = "ok"
    error: str | None = None


@dataclass
class ConfigSnapshot:
    """The server's configuration as known at the incident: engine flags and where they came from."""

    ts_ms: int | None
    source: str  # e.g. "process command line (pid 4711) + vllm:cache_config_info"
    model: str | None = None
    flags: dict[str, str] = field(default_factory=dict)  # "--max-num-seqs" -> "256", as passed or defaulted
    defaulted: set[str] = field(default_factory=set)  # flags not on the command line: vLLM's default
    extra: dict[str, str] = field(default_factory=dict)  # facts that are not flags (num_gpu_blocks, ...)
    origins: dict[str, str] = field(default_factory=dict)  # flag or fact -> where it came from, for the table
    unknown: dict[str, str] = field(default_factory=dict)  # names nobody could tell -> why


@dataclass
class ReportData:
    """Everything one report shows, as plain data; `assemble` builds it from a store."""

    incident: dict  # one incident of the diagnose JSON contract
    window_ms: tuple[int, int]  # the charted range around the incident
    generated_ms: int
    source: str = ""
    evidence_series: dict[str, list[LabeledSeries]] = field(default_factory=dict)
    evidence_exprs: dict[str, str] = field(default_factory=dict)  # signal -> PromQL, shown for reproducibility
    evidence_descriptions: dict[str, str] = field(default_factory=dict)
    config: ConfigSnapshot | None = None
    fixes: list[dict] = field(default_factory=list)
    stacks: list[ProcessStacks] = field(default_factory=list)
    traces: list[dict] = field(default_factory=list)  # vLLM profiler captures: kind, status, artifact, files, error
    related: list[dict] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)  # signals that have a chart file beside the report

    def to_dict(self) -> dict:
        """JSON-ready form (fixtures, the daemon API): tuples become lists, sets sorted lists."""
        d = asdict(self)
        if self.config is not None:
            d["config"]["defaulted"] = sorted(self.config.defaulted)
        d["evidence_series"] = {k: [{"labels": lbl, "points": [list(p) for p in pts]} for lbl, pts in v]
                                for k, v in self.evidence_series.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ReportData":
        """The inverse of to_dict."""
        cfg = d.get("config")
        return cls(
            incident=d["incident"], window_ms=(int(d["window_ms"][0]), int(d["window_ms"][1])),
            generated_ms=int(d["generated_ms"]), source=d.get("source", ""),
            evidence_series={k: [(dict(s["labels"]), [(int(t), v) for t, v in s["points"]]) for s in v]
                             for k, v in (d.get("evidence_series") or {}).items()},
            evidence_exprs=dict(d.get("evidence_exprs") or {}),
            evidence_descriptions=dict(d.get("evidence_descriptions") or {}),
            config=None if cfg is None else ConfigSnapshot(
                ts_ms=cfg.get("ts_ms"), source=cfg.get("source", ""), model=cfg.get("model"),
                flags=dict(cfg.get("flags") or {}), defaulted=set(cfg.get("defaulted") or []),
                extra=dict(cfg.get("extra") or {}), origins=dict(cfg.get("origins") or {}),
                unknown=dict(cfg.get("unknown") or {})),
            fixes=list(d.get("fixes") or []),
            stacks=[ProcessStacks(**{**p, "top_frames": [(f, float(s), c) for f, s, c in p.get("top_frames") or []]})
                    for p in d.get("stacks") or []],
            traces=list(d.get("traces") or []),
            related=list(d.get("related") or []), missing=list(d.get("missing") or []),
            charts=list(d.get("charts") or []),
        )


# -- small formatting helpers ---------------------------------------------------------------------

def utc(ms: int, with_date: bool = True) -> str:
    """ms to '2026-11-29 10:04:05 UTC' (or '10:04:05' without the date)."""
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S UTC") if with_date else dt.strftime("%H:%M:%S")


def duration(ms: int) -> str:
    """ms as a short human duration: 272000 -> '4m 32s'; 3_723_000 -> '1h 2m 3s'."""
    s = max(0, ms) // 1000
    h, m, sec = s // 3600, s % 3600 // 60, s % 60
    parts = [f"{h}h"] * bool(h) + [f"{m}m"] * bool(m) + [f"{sec}s"] * (bool(sec) or not (h or m))
    return " ".join(parts)


def format_with_unit(value: float | None, unit: str) -> str:
    """A value with its unit as a person reads it: (0.0042, 's') -> '4.2 ms'; (0.97, 'ratio') -> '97 %'."""
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return "n/a"
    if unit == "s":
        if abs(value) < 1:
            return f"{_num(value * 1000)} ms"
        return f"{_num(value)} s"
    if unit == "ratio":
        return f"{_num(value * 100)} %"
    if unit == "%":
        return f"{_num(value)} %"
    if unit in ("B", "bytes"):
        for size, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= size:
                return f"{_num(value / size)} {name}"
        return f"{_num(value)} B"
    if unit.startswith("1/"):  # a rate: 2.4/s
        return f"{_num(value)}{unit[1:]}"
    return f"{_num(value)} {unit}".rstrip()


def _num(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _cell(text: object) -> str:
    # every value from data is escaped, in a table cell or not: a pipe, a newline or HTML breaks the report
    return escape_md(text)


def _code(text: object) -> str:
    return escape_md(text, code=True)


def _values_in(series: Sequence[LabeledSeries], lo: int, hi: int | None) -> list[Point]:
    return [(t, v) for _, pts in series for t, v in pts
            if v is not None and not math.isnan(v) and t >= lo and (hi is None or t <= hi)]


# -- sections ---------------------------------------------------------------------------------------

def incident_span(data: ReportData) -> tuple[int, int | None]:
    """(start ms, end ms or None while firing) of the report's incident."""
    inc = data.incident
    return parse_rfc3339_ms(inc["start"]), parse_rfc3339_ms(inc["end"]) if inc.get("end") else None


def peak_of(data: ReportData) -> tuple[str, int, float, str] | None:
    """(signal, time, value, unit) of the worst point of the first charted evidence signal in the incident."""
    start, end = incident_span(data)
    for ev in data.incident.get("evidence", []):
        pts = _values_in(data.evidence_series.get(ev["signal"], []), start, end)
        if not pts:
            continue
        threshold, value = ev.get("threshold"), ev.get("value")
        # a "too low" signal (GPU idle while requests wait) peaks at its minimum
        low_is_bad = threshold is not None and value is not None and value < threshold
        # the earliest of equal extremes: when the signal first got that bad
        if low_is_bad:
            t, v = min(pts, key=lambda p: (p[1], p[0]))
        else:
            t, v = max(pts, key=lambda p: (p[1], -p[0]))
        return ev["signal"], t, v, ev.get("unit", "")
    return None


def _title(data: ReportData) -> list[str]:
    inc = data.incident
    sev = inc.get("severity") or "severity unknown"
    state = "still firing" if inc.get("state") == "firing" else "resolved"
    lines = [f"# {_cell(inc.get('incident', 'incident'))} on {_cell(inc.get('instance', '?'))} "
             f"({_cell(sev)}, {state})", ""]
    summary = str(inc.get("summary") or "").strip()
    lines += [f"**Verdict:** {_cell(summary) if summary else 'no summary was recorded for this incident.'}", ""]
    meta = [f"incident {_code(inc.get('id', '?'))}", f"rule {_code(inc.get('rule', '?'))}"]
    labels = inc.get("labels") or {}
    if labels:
        meta.append("labels " + ", ".join(_code(f"{k}={v}") for k, v in sorted(labels.items())))
    lines += ["; ".join(meta), ""]
    if inc.get("caused_by"):  # a symptom: what explains it comes first (names where the related list has them)
        names = {cid: name for name, cid in explaining(inc, data.related)}
        causes = ", ".join(f"{_code(names[c])} " * (c in names) + _code(c) for c in inc["caused_by"])
        lines += [f"**Explained by:** {causes} (episode {_code(inc.get('episode', '?'))}): fix the cause first.", ""]
    return lines


def _timeline(data: ReportData) -> list[str]:
    start, end = incident_span(data)
    rows = [("started", utc(start))]
    peak = peak_of(data)
    if peak:
        signal, t, v, unit = peak
        rows.append(("peak", f"{utc(t)}: {_code(signal)} = {_cell(format_with_unit(v, unit))}"))
    if end is not None:
        rows.append(("resolved", utc(end)))
        rows.append(("duration", duration(end - start)))
    else:
        rows.append(("resolved", f"not yet (still firing when this report was written, {utc(data.generated_ms)})"))
        rows.append(("duration", f"{duration(data.generated_ms - start)} so far"))
    out = ["## Timeline", "", "| event | when |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]  # each value escaped where it was made
    return out + [""]


def _evidence(data: ReportData) -> list[str]:
    evidence = data.incident.get("evidence") or []
    out = ["## Evidence", ""]
    if not evidence:
        return out + ["The rule recorded no evidence signals for this incident.", ""]
    out += ["| signal | value | threshold | unit | around the incident |", "|---|---:|---:|---|---|"]
    for ev in evidence:
        unit = ev.get("unit", "")
        series = data.evidence_series.get(ev["signal"], [])
        threshold = ev.get("threshold")
        spark = evidence_sparkline(series, data.window_ms, threshold)
        out.append(f"| {_code(ev['signal'])} | {_cell(format_with_unit(ev.get('value'), unit))} | "
                   f"{'-' if threshold is None else _cell(format_with_unit(threshold, unit))} | "
                   f"{_cell(unit) if unit else '-'} | {('`' + spark + '`') if spark.strip() else 'no samples'} |")
    out.append("")
    exprs = [(ev["signal"], data.evidence_exprs[ev["signal"]]) for ev in evidence if ev["signal"] in data.evidence_exprs]
    if exprs:
        body = [line for signal, expr in exprs for line in (f"# {signal}", " ".join(str(expr).split()))]
        out += ["<details><summary>PromQL behind each signal</summary>", "", *fenced(body, "promql"),
                "", "</details>", ""]
    return out


def evidence_sparkline(series: Sequence[LabeledSeries], window: tuple[int, int], threshold: float | None,
                       width: int = SPARK_WIDTH) -> str:
    """One line over the window, the max across label sets in each time bucket; gaps stay blank.

    The scale starts at 0 for non-negative signals and reaches the threshold, so a signal far below its
    threshold reads low instead of being stretched to full height.
    """
    points = [(t, v) for _, pts in series for t, v in pts]
    good = [v for t, v in points if v is not None and not math.isnan(v) and window[0] <= t <= window[1]]
    if not good:
        return ""
    lo = min(0.0, min(good))
    hi = max(good) if threshold is None else max(max(good), threshold)
    return time_sparkline(points, window[0], window[1], width=width, lo=lo, hi=hi)


def _charts(data: ReportData) -> list[str]:
    out = ["## Charts", ""]
    if not data.charts:
        if any(m.startswith("charts:") for m in data.missing):  # the charts extra is not installed
            return out + ["No chart: matplotlib is not installed (see what was not checked below).", ""]
        if any(m.startswith("charts not drawn:") for m in data.missing):  # the drawing process failed
            return out + ["No chart: drawing them failed (see what was not checked below).", ""]
        return out + ["No chart: no evidence signal had samples around the incident.", ""]
    out.append(f"From {utc(data.window_ms[0])} to {utc(data.window_ms[1])}; the shaded band is the incident, "
               "the dashed line its threshold.")
    out.append("")
    for signal in data.charts:
        out += [f"![{_cell(signal)}]({chart_filename(signal)})", ""]
    return out


def _config(data: ReportData) -> list[str]:
    out = ["## Configuration at the time", ""]
    cfg = data.config
    if cfg is None:
        return out + ["No configuration snapshot was recorded, so the fixes below could not read the live values.",
                      ""]
    when = f"Snapshot of {utc(cfg.ts_ms)}" if cfg.ts_ms is not None else "Snapshot time unknown"
    out += [f"{when}, from {_cell(cfg.source)}." + (f" Model {_code(cfg.model)}." if cfg.model else ""), ""]
    if cfg.flags or cfg.extra:
        out += ["| setting | value | origin |", "|---|---|---|"]
        for flag, value in sorted(cfg.flags.items()):
            origin = cfg.origins.get(flag) or ("vLLM default" if flag in cfg.defaulted else "command line")
            out.append(f"| {_code(flag)} | {_cell(value)} | {_cell(origin)} |")
        for key, value in sorted(cfg.extra.items()):
            out.append(f"| {_cell(key)} | {_cell(value)} | {_cell(cfg.origins.get(key, 'measured'))} |")
        out.append("")
    if cfg.unknown:
        by_reason: dict[str, list[str]] = {}
        for name, why in sorted(cfg.unknown.items()):
            by_reason.setdefault(why, []).append(_code(name))
        out += ["Not known at the time (fixes that need these say so):", ""]
        out += [f"- {', '.join(names)}: {_cell(why)}" for why, names in sorted(by_reason.items(), key=lambda kv: kv[1])]
        out.append("")
    return out


def serve_command(model: str, flags: dict[str, str], defaulted: set[str], touched: Sequence[str]) -> str:
    """A `vllm serve` line: the flags given on the command line plus the ones a fix touches.

    serve_command('m', {'--max-num-seqs': '256'}, set(), []) -> 'vllm serve m --max-num-seqs 256'
    """
    parts = ["vllm", "serve", shlex.quote(model)]
    for flag in sorted(flags):
        if flag in defaulted and flag not in touched:
            continue  # a default nobody changes is noise on the line
        value = flags[flag]
        if value in ("true", "false"):  # vLLM's switches are BooleanOptionalAction: --flag / --no-flag
            parts.append(flag if value == "true" else "--no-" + flag[2:])
        else:
            parts += [flag, shlex.quote(value)]
    return " ".join(parts)


def is_flag_value(value: object) -> bool:
    """True for a value that fits on a command line ('128', '0.85', 'fcfs'), not advice in words."""
    return value is not None and str(value) != "" and not any(c.isspace() for c in str(value))


def with_current_values(fixes: list[dict], cfg: ConfigSnapshot | None) -> list[dict]:
    """Fixes whose `current` is unknown take it from the configuration snapshot, when that has the flag."""
    if cfg is None:
        return fixes
    return [{**f, "current": cfg.flags[f["param"]]} if f.get("current") is None and f.get("param") in cfg.flags
            else f for f in fixes]


def prediction_text(p: dict) -> str:
    """'predicted: TTFT p95 0.6 s, TPOT p95 0.0096 s, goodput 0.95 req/s (100% of requests within the objectives),
    1.9e+02 tokens/s, 0 preemptions/s', and the trade where the fix buys one signal with another."""
    def n(key: str) -> str:
        return "-" if p.get(key) is None else f"{p[key]:.3g}"
    share = "" if p.get("slo_attainment") is None else f" ({p['slo_attainment']:.0%} of requests within the objectives)"
    text = (f"predicted: TTFT p95 {n('ttft_p95_s')} s, TPOT p95 {n('tpot_p95_s')} s, goodput {n('goodput_rps')} "
            f"req/s{share}, {n('throughput_tps')} tokens/s, {n('preemptions_per_s')} preemptions/s")
    return text + (f"; a trade: {p['trade']}" if p.get("trade") else "")


def calibration_text(model: dict) -> str:
    """'its replay of the incident's stretch: TTFT p95 off by 0%, preemptions/s 24%, ...'."""
    names = {"ttft_p95_s": "TTFT p95", "itl_p95_s": "inter-token p95", "preemptions_per_s": "preemptions/s",
             "generation_tokens_per_s": "tokens/s"}
    errors = ", ".join(f"{names.get(k, k)} {v:.0%}" for k, v in (model.get("calibration_error") or {}).items()
                       if v is not None)
    return f"its replay of the incident's stretch was off by {errors}"


def _fixes(data: ReportData) -> list[str]:
    out = ["## Suggested fix", ""]
    fixes = with_current_values(data.fixes, data.config)
    if not fixes:
        return out + ["The rule suggests no parameter change for this incident.", ""]
    model = data.incident.get("model") or {}
    if model.get("withheld"):
        out += [f"Predictions withheld: {_cell(model['withheld'])}", ""]
    elif model.get("calibration_error"):
        base = model.get("as_configured") or {}
        out += [f"Ranked by the goodput the what-if model predicts ({_cell(calibration_text(model))}); as "
                f"configured it {_cell(prediction_text(base))}.", ""]
    for i, fix in enumerate(fixes, 1):
        current = fix.get("current")
        head = (f"{i}. **{_code(fix['param'])} {_cell(current) if current is not None else '(not set)'} → "
                f"{_cell(fix.get('suggested', '?'))}**")
        out.append(head)
        if fix.get("why"):
            out += ["", f"   {_cell(' '.join(str(fix['why']).split()))}"]
        if fix.get("predicted"):
            out += ["", f"   {_cell(prediction_text(fix['predicted']))}"]
        arithmetic = fix.get("arithmetic")
        if arithmetic:
            lines = arithmetic if isinstance(arithmetic, list) else str(arithmetic).splitlines()
            out += ["", *[f"   {ln}" for ln in fenced([str(ln) for ln in lines], "text")]]
        out.append("")
    cfg = data.config
    model = (cfg.model if cfg and cfg.model else None) or (data.incident.get("labels") or {}).get("model_name") or "MODEL"
    before = dict(cfg.flags) if cfg else {}
    defaulted = set(cfg.defaulted) if cfg else set()
    after = dict(before)
    touched = []
    for fix in fixes:
        param, suggested = fix["param"], fix.get("suggested")
        if not is_flag_value(suggested) or not str(param).startswith("--"):
            continue  # advice in words, replicas or an env var: not a `vllm serve` flag
        touched.append(param)
        if fix.get("current") is not None and param not in before:
            before[param] = str(fix["current"])
            defaulted.add(param)
        after[param] = str(suggested)
        break  # one setting at a time: the first flag fix above, then `compare` says what it did
    if not touched:
        return out + ["No fix names a concrete value, so there is no command line to change.", ""]
    out += [f"The first of these that is a flag, {_code(touched[0])}, as a command line (change one setting, "
            "then verify with `vllm-sentinel compare --change auto`):", "", *fenced([f"- {serve_command(model, before, defaulted, touched)}",
                                              f"+ {serve_command(model, after, defaulted, touched)}"], "diff"), ""]
    if cfg is None:
        out += ["(No configuration snapshot: the line shows only the flags the fix changes.)", ""]
    return out


def _stacks(data: ReportData) -> list[str]:
    out = ["## Stack evidence", ""]
    if not data.stacks:
        out += ["No stack capture is linked to this incident (see what was not checked below).", ""]
    return out + _stack_lines(data) + _trace_lines(data)


def _trace_lines(data: ReportData) -> list[str]:
    """Where vLLM's own profiler put its trace for this incident, or why it took none."""
    out = []
    for t in data.traces:
        what = {"nsys": "Nsight Systems (via vLLM's cuda profiler)"}.get(t["kind"], "vLLM's torch profiler")
        when = utc(int(t["ts"]), with_date=False)
        if t["status"] == "ok":
            n = len(t.get("files") or [])
            files = f" ({n} file{'' if n == 1 else 's'})" if n else ""
            out.append(f"- {what} at {when}, {(t.get('duration_ms') or 0) / 1000:.1f} s: trace in "
                       f"{_code(t.get('artifact') or 'the server-side directory')}{files}.")
        else:
            out.append(f"- {what} at {when}: not taken ({_cell(t['status'])}): {_cell(t.get('error') or 'no detail')}")
    return ["### vLLM profiler", "", *out, ""] if out else []


def _stack_lines(data: ReportData) -> list[str]:
    out: list[str] = []
    for p in data.stacks:
        head = f"### {_cell(p.role)} (pid {int(p.pid)}), py-spy {_cell(p.kind)} at {utc(p.ts_ms, with_date=False)}"
        if p.status not in ("ok", "truncated"):
            out += [head, "", f"Capture failed ({_cell(p.status)}): {_cell(p.error or 'no detail')}", ""]
            continue
        out += [head, "", f"{int(p.samples)} samples" + (" (output truncated: a prefix was kept)"
                                                    if p.status == "truncated" else "") + ".", ""]
        if p.class_shares:
            shares = sorted(p.class_shares.items(), key=lambda kv: (-kv[1], kv[0]))
            out.append("Where the time went: " + ", ".join(f"{_cell(name)} {share:.0%}" for name, share in shares) + ".")
            out.append("")
        if p.top_frames:
            out += ["| share | class | frame |", "|---:|---|---|"]
            out += [f"| {share:.0%} | {_cell(cls)} | {_code(frame)} |" for frame, share, cls in p.top_frames]
            out.append("")
    return out


def _related(data: ReportData) -> list[str]:
    out = ["## Related incidents", ""]
    if not data.related:
        return out + ["None in the same window.", ""]
    out += ["| incident | severity | instance | started | ended | summary |", "|---|---|---|---|---|---|"]
    for r in data.related:
        ended = utc(parse_rfc3339_ms(r["end"]), with_date=False) if r.get("end") else "still firing"
        out.append(f"| {_code(r.get('incident', '?'))} ({_code(r.get('id', '?'))}) | {_cell(r.get('severity', ''))} | "
                   f"{_cell(r.get('instance', ''))} | {utc(parse_rfc3339_ms(r['start']), with_date=False)} | {ended} | "
                   f"{_cell(r.get('summary', ''))} |")
    return out + [""]


def _missing(data: ReportData) -> list[str]:
    out = ["## What was not checked", ""]
    if not data.missing:
        return out + ["Nothing: metrics, GPU counters, stacks and configuration were all available.", ""]
    return out + [f"- {escape_md_with_code(m)}" for m in data.missing] + [""]


def render_markdown(data: ReportData) -> str:
    """The whole report as Markdown text; the same data always gives the same bytes."""
    lines: list[str] = []
    for section in (_title, _timeline, _evidence, _charts, _config, _fixes, _stacks, _related, _missing):
        lines += section(data)
    lines += ["---", "", f"_Written by vllm-sentinel at {utc(data.generated_ms)}"
              + (f" from {_cell(data.source)}" if data.source else "") + "._", ""]
    return "\n".join(lines)
