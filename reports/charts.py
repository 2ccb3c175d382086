"""One PNG chart per evidence signal around an incident (matplotlib, Agg), plus the chart's data.

The data (`chart_data`) is what golden tests compare; the PNG (`draw_chart`) is what a person reads
in a GitHub preview: incident window shaded, threshold dashed, UTC times, the unit on the axis.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

# (labels, points) with points = [(ts_ms, value or None)]; None / NaN is a gap (staleness, no data)
Point = tuple[int, float | None]
LabeledSeries = tuple[dict[str, str], Sequence[Point]]

MAX_LINES = 8  # more lines than this is unreadable: keep the ones that reach highest
WIDTH_IN, HEIGHT_IN, DPI = 9.0, 3.4, 110  # ~990x374 px: full width of a GitHub preview, no downscaling

# a unit as stored -> (display unit, factor), chosen by the peak so ticks read naturally
_SMALL_SECONDS = ("ms", 1000.0)


def chart_filename(signal: str) -> str:
    """The PNG name for a signal, safe on every filesystem: 'vllm:kv usage' -> 'chart-vllm_kv_usage.png'."""
    return "chart-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", signal).strip("_") + ".png"


def _clean(v: float | None) -> float | None:
    if v is None or math.isnan(v) or math.isinf(v):
        return None
    return round(float(v), 9)  # stable JSON across platforms; far below what a chart shows


def series_label(labels: dict[str, str], varying: Sequence[str], signal: str = "value") -> str:
    """Legend text: only the labels that differ between the lines, 'engine=0, model_name=m'."""
    keys = [k for k in varying if k in labels] or sorted(labels)
    return ", ".join(f"{k}={labels[k]}" for k in keys) or axis_name(signal)


def chart_data(signal: str, series: Sequence[LabeledSeries], *, window_ms: tuple[int, int],
               incident_ms: tuple[int, int | None], threshold: float | None = None, unit: str = "",
               description: str = "") -> dict:
    """The plotted data as plain JSON-ready values; the golden tests' view of a chart.

    chart_data('waiting', [({'engine': '0'}, [(1000, 2.0), (2000, None)])], window_ms=(0, 3000),
               incident_ms=(1000, None), threshold=1, unit='') ->
    {'signal': 'waiting', 'unit': '', 'threshold': 1.0, 'window': [0, 3000], 'incident': [1000, None],
     'description': '', 'lines': [{'label': 'engine=0', 'labels': {'engine': '0'},
                                   'points': [[1000, 2.0], [2000, None]]}], 'dropped_lines': 0}
    """
    prepared = [(dict(lbl), [(int(t), _clean(v)) for t, v in pts]) for lbl, pts in series]
    # the same signal split by labels: order by how high each line reaches (ties: by labels) and cap
    prepared.sort(key=lambda s: (-max((v for _, v in s[1] if v is not None), default=-math.inf),
                                 sorted(s[0].items())))
    kept, dropped = prepared[:MAX_LINES], max(0, len(prepared) - MAX_LINES)
    keys = sorted({k for lbl, _ in kept for k in lbl})
    varying = [k for k in keys if len({lbl.get(k) for lbl, _ in kept}) > 1]
    return {
        "signal": signal, "unit": unit,
        "threshold": None if threshold is None else float(threshold),
        "window": [int(window_ms[0]), int(window_ms[1])],
        "incident": [int(incident_ms[0]), None if incident_ms[1] is None else int(incident_ms[1])],
        "description": description,
        "lines": [{"label": series_label(lbl, varying, signal), "labels": lbl, "points": [[t, v] for t, v in pts]}
                  for lbl, pts in kept],
        "dropped_lines": dropped,
    }


def display_unit(unit: str, peak: float | None) -> tuple[str, float]:
    """How to show a stored unit on the axis: ('s', 0.004) -> ('ms', 1000.0); ratio -> percent."""
    if unit == "s" and peak is not None and abs(peak) < 1.0:
        return _SMALL_SECONDS
    if unit == "ratio":
        return "%", 100.0
    if unit.startswith("1/"):  # a rate: '1/s' reads as 'per s'
        return "per " + unit[2:], 1.0
    if unit in ("B", "bytes"):
        if peak is not None and abs(peak) >= 2**30:
            return "GiB", 1 / 2**30
        return "MiB", 1 / 2**20
    return unit, 1.0


def _fmt_number(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


CHARTS_MISSING = "charts: matplotlib is not installed; `pip install 'vllm-sentinel[charts]'` to get them"


class ChartsUnavailable(RuntimeError):
    """matplotlib (the `charts` extra) cannot be imported: reports go out without charts."""


def _matplotlib() -> tuple:
    """(matplotlib.dates, pyplot, FuncFormatter), or ChartsUnavailable naming the install line."""
    try:
        # matplotlib is the charts extra and slow to import: loaded when a chart is drawn, not with the CLI
        import matplotlib
        matplotlib.use("Agg")  # no display on a server; must precede pyplot
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        raise ChartsUnavailable(f"{CHARTS_MISSING} ({e})") from None
    return mdates, plt, FuncFormatter


def charts_available() -> bool:
    """True when matplotlib imports, so draw_chart can draw."""
    try:
        _matplotlib()
    except ChartsUnavailable:
        return False
    return True


def draw_chart(data: dict, path: str | Path) -> Path:
    """Draw `data` (from chart_data) as a PNG at `path`; returns the path (ChartsUnavailable without matplotlib)."""
    mdates, plt, FuncFormatter = _matplotlib()  # noqa: N806 (the class, under its own name)
    path = Path(path)
    values = [v for line in data["lines"] for _, v in line["points"] if v is not None]
    peak = max((abs(v) for v in values), default=None)
    if data["threshold"] is not None:
        peak = max(peak or 0.0, abs(data["threshold"]))
    shown_unit, factor = display_unit(data["unit"], peak)

    fig, ax = plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    try:
        start, end = data["window"]
        inc_start, inc_end = data["incident"]
        still_firing = inc_end is None
        ax.axvspan(_dt(inc_start), _dt(end if still_firing else inc_end), color="#d62728", alpha=0.12, lw=0,
                   label="incident (still firing)" if still_firing else "incident")
        colors = plt.get_cmap("tab10").colors
        for i, line in enumerate(data["lines"]):
            xs = [_dt(t) for t, _ in line["points"]]
            ys = [math.nan if v is None else v * factor for _, v in line["points"]]
            ax.plot(xs, ys, color=colors[i % len(colors)], lw=1.8, label=line["label"],
                    marker="o" if len(xs) <= 3 else None, ms=3)
        if data["threshold"] is not None:
            ax.axhline(data["threshold"] * factor, color="#555555", ls="--", lw=1.2,
                       label=f"threshold {_fmt_number(data['threshold'] * factor)} {shown_unit}".rstrip())
        if not values:
            ax.text(0.5, 0.5, "no samples in this window", transform=ax.transAxes, ha="center", va="center",
                    color="#777777", fontsize=11)

        title = data["signal"] + (f": {data['description']}" if data.get("description") else "")
        ax.set_title(title, loc="left", fontsize=11)
        ax.set_ylabel(f"{axis_name(data['signal'])} ({shown_unit})" if shown_unit else axis_name(data["signal"]),
                      fontsize=9)
        day0, day1 = _dt(start).strftime("%Y-%m-%d"), _dt(end).strftime("%Y-%m-%d")
        ax.set_xlabel(f"time (UTC), {day0}" + ("" if day0 == day1 else f" to {day1}"), fontsize=9)
        ax.set_xlim(_dt(start), _dt(end))
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=timezone.utc, minticks=4, maxticks=9))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _fmt_number(v)))
        if values and min(values) >= 0:
            ax.set_ylim(bottom=0)  # counts, rates and latencies start at zero: no exaggerated wiggles
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  title=f"+{data['dropped_lines']} lower lines not drawn" if data.get("dropped_lines") else None,
                  title_fontsize=7)
        fig.tight_layout()
        # no Software/date metadata: the same data gives the same file on a rerun
        fig.savefig(path, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return path


def axis_name(signal: str) -> str:
    """A signal as axis text, its unit suffix dropped: 'queue_time_p95_seconds' -> 'queue time p95'."""
    name = re.sub(r"_(seconds|percent|ratio|bytes|mib|per_s)$", "", signal)
    return name.replace("_", " ")


def render_chart(signal: str, series: Sequence[LabeledSeries], out_dir: str | Path, *,
                 window_ms: tuple[int, int], incident_ms: tuple[int, int | None], threshold: float | None = None,
                 unit: str = "", description: str = "") -> tuple[Path, dict]:
    """Write the chart of one signal into out_dir; returns (PNG path, the chart's data)."""
    data = chart_data(signal, series, window_ms=window_ms, incident_ms=incident_ms, threshold=threshold,
                      unit=unit, description=description)
    return draw_chart(data, Path(out_dir) / chart_filename(signal)), data


def draw_load_latency_chart(data: dict, path: str | Path) -> Path:
    """A load-latency PNG (reports/capacity.py load_latency_data): one panel per latency signal, request rate
    on x, bins as dots, load levels as a line, the objective dashed, SLO point and knee as vertical lines."""
    _mdates, plt, FuncFormatter = _matplotlib()  # noqa: N806 (the class, under its own name)
    path = Path(path)
    panels = data["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, squeeze=False)
    try:
        for ax, panel in zip(axes[0], panels):
            ys = [y for _, y in panel["bins"] + panel["levels"]] + [panel["objective"]]
            unit, factor = display_unit("s", max(ys))
            if panel["bins"]:
                ax.scatter([x for x, _ in panel["bins"]], [y * factor for _, y in panel["bins"]], s=10,
                           color="#1f77b4", alpha=0.45, label="bins")
            if panel["levels"]:
                ax.plot([x for x, _ in panel["levels"]], [y * factor for _, y in panel["levels"]], color="#1f77b4",
                        marker="o", lw=1.8, ms=5, label="load levels")
            ax.axhline(panel["objective"] * factor, color="#555555", ls="--", lw=1.2,
                       label=f"objective {_fmt_number(panel['objective'] * factor)} {unit}")
            if data.get("slo_point_rate") is not None:
                ax.axvline(data["slo_point_rate"], color="#2ca02c", lw=1.4, label="SLO point")
            if data.get("knee_rate") is not None:
                ax.axvline(data["knee_rate"], color="#d62728", ls=":", lw=1.4, label="knee")
            ax.set_title(panel["title"], loc="left", fontsize=11)
            ax.set_xlabel("completed requests/s per instance", fontsize=9)
            ax.set_ylabel(f"{panel['title']} ({unit})", fontsize=9)
            ax.set_xlim(left=0)
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _fmt_number(v)))
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=8)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        axes[0][0].legend(fontsize=7, loc="best", frameon=False)
        fig.suptitle(data.get("title", ""), fontsize=10, x=0.01, ha="left")
        fig.tight_layout()
        fig.savefig(path, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return path
