"""Charts: their data against goldens (not pixels), the data rules, and a real PNG drawn with matplotlib."""

from __future__ import annotations

import json
import struct

import pytest
from report_goldens import CASES, check_golden, load_fixture, render_case

from vllm_sentinel.reports.charts import (MAX_LINES, axis_name, chart_data, chart_filename, display_unit,
                                          render_chart)
from vllm_sentinel.reports.write import plan_charts, write_report

W = (0, 600_000)


@pytest.mark.parametrize("name", CASES)
def test_chart_data_matches_golden(name: str, regen_golden: bool) -> None:
    for path, text in render_case(name).items():
        if path.name.endswith(".charts.json"):
            check_golden(path, text, regen_golden)


def test_one_chart_per_evidence_signal_in_evidence_order() -> None:
    data = load_fixture("kv_cache_pressure")
    charts = plan_charts(data)
    assert [c["signal"] for c in charts] == [e["signal"] for e in data.incident["evidence"]]
    first = charts[0]
    assert first["threshold"] == 0.1 and first["unit"] == "1/s"
    assert first["incident"] == [1795947840000, 1795948410000] and first["window"] == list(data.window_ms)


def test_gaps_stay_gaps_and_nan_is_none() -> None:
    d = chart_data("x", [({}, [(0, 1.0), (1000, float("nan")), (2000, None), (3000, float("inf"))])],
                   window_ms=W, incident_ms=(0, None))
    assert d["lines"][0]["points"] == [[0, 1.0], [1000, None], [2000, None], [3000, None]]


def test_lines_are_capped_keeping_the_highest_and_only_varying_labels_in_legend() -> None:
    series = [({"engine": str(i), "model_name": "m"}, [(0, float(i))]) for i in range(MAX_LINES + 3)]
    d = chart_data("x", series, window_ms=W, incident_ms=(0, 1))
    assert d["dropped_lines"] == 3 and len(d["lines"]) == MAX_LINES
    assert d["lines"][0]["label"] == f"engine={MAX_LINES + 2}"  # the highest first; model_name is the same everywhere


def test_unlabelled_series_is_named_after_the_signal() -> None:
    d = chart_data("queue_time_p95_seconds", [({}, [(0, 1.0)])], window_ms=W, incident_ms=(0, 1))
    assert d["lines"][0]["label"] == "queue time p95"


def test_display_units_read_naturally() -> None:
    assert display_unit("s", 0.2) == ("ms", 1000.0) and display_unit("s", 4.0) == ("s", 1.0)
    assert display_unit("ratio", 0.9) == ("%", 100.0) and display_unit("1/s", 2.0) == ("per s", 1.0)
    assert display_unit("B", 70 * 2**30) == ("GiB", 1 / 2**30)
    assert axis_name("kv_cache_usage_ratio") == "kv cache usage"


def test_chart_filename_is_filesystem_safe() -> None:
    assert chart_filename("vllm:kv usage/max") == "chart-vllm_kv_usage_max.png"


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_render_chart_writes_a_png_wide_enough_for_a_github_preview(tmp_path) -> None:
    data = load_fixture("queue_blocking")
    path, d = render_chart("queue_time_p95_seconds", data.evidence_series["queue_time_p95_seconds"], tmp_path,
                           window_ms=data.window_ms, incident_ms=(1795946580000, None), threshold=1.0, unit="s")
    width, height = _png_size(path)
    assert 800 <= width <= 1400 and 250 <= height <= 600
    assert d["threshold"] == 1.0 and path.name == "chart-queue_time_p95_seconds.png"


def test_same_data_gives_the_same_png(tmp_path) -> None:
    data = load_fixture("kv_cache_pressure")
    pngs = []
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        path, _ = render_chart("kv", data.evidence_series["kv_cache_usage_max"], tmp_path / sub,
                               window_ms=data.window_ms, incident_ms=(1795947840000, 1795948410000),
                               threshold=0.95, unit="ratio")
        pngs.append(path.read_bytes())
    assert pngs[0] == pngs[1]


def test_a_chart_with_no_samples_still_draws(tmp_path) -> None:
    path, d = render_chart("empty", [], tmp_path, window_ms=W, incident_ms=(100, None))
    assert d["lines"] == [] and _png_size(path)[0] > 0


def test_write_report_puts_markdown_and_every_referenced_png_in_the_incident_folder(tmp_path) -> None:
    data = load_fixture("kv_cache_pressure")
    out = write_report(data, tmp_path)
    assert out.directory == tmp_path / "kv-20261129-1024-a21e" and out.markdown.name == "report.md"
    text = out.markdown.read_text()
    assert [p.name for p in out.charts] == [f"chart-{e['signal']}.png" for e in data.incident["evidence"]]
    for png in out.charts:
        assert f"]({png.name})" in text and png.exists()
    assert not list(out.directory.glob("*.tmp"))
    # the Markdown on disk is the golden's text: what the tests check is what users get
    golden = {p.suffix: t for p, t in render_case("kv_cache_pressure").items()}
    assert text == golden[".md"]
    json.dumps(plan_charts(data))  # chart data is JSON-ready
