"""The compare document for people: the terminal table, Markdown, and one before/after chart per signal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.diagnosis.compare import CompareRequest, compare
from vllm_sentinel.agent.diagnosis.compare_sources import store_source
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.reports.charts import charts_available
from vllm_sentinel.reports.compare_view import VERDICT_STYLE, compare_charts, compare_markdown, render_compare


@pytest.fixture(scope="module")
def doc(recorded_db: tuple) -> dict:
    """compare over the recorded real session: queue_blocking before, kv_cache_pressure after."""
    phases = {s["name"]: (s["start_ms"], s["end_ms"]) for s in load_metadata(default_recording())["scenarios"]}
    path, first, last = recorded_db
    with Store.open(path, read_only=True) as store:
        return compare(store_source(store, pack_window_evaluator(load_pack())),
                       CompareRequest((first, last), before=phases["queue_blocking"], after=phases["kv_cache_pressure"]))


def test_the_table_leads_with_configuration_slo_and_verdict(doc: dict) -> None:
    buf = io.StringIO()
    render_compare(Console(file=buf, width=80, color_system=None), doc)
    text = buf.getvalue()
    assert text.index("configuration:") < text.index("SLO: TTFT p95 < 2 s, TPOT p95 < 100 ms") < \
        text.index("verdict: regressed") < text.index("preemptions_per_s")
    assert "attainment 87.4% -> 0%; goodput 9.76 -> 0 requests/s" in text, text
    assert text.index("verdict: regressed") < text.index("goodput_rps 9.76 -> 0 /s")
    assert "started: kv_cache_pressure" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_markdown_charts_both_windows(doc: dict, tmp_path: Path) -> None:
    charts = compare_charts(doc)
    pre = next(c for c in charts if c["signal"] == "preemptions_per_s")
    assert [line["labels"]["window"] for line in sorted(pre["lines"], key=lambda x: x["label"])] == ["after", "before"]
    assert all(v == 0 for line in pre["lines"] if line["labels"]["window"] == "before" for _, v in line["points"])
    text = compare_markdown(doc, tmp_path)
    assert text.startswith("# vllm-sentinel compare: regressed")
    assert text.index("## Configuration") < text.index("## SLO") < text.index("## Verdict: regressed") < \
        text.index("## Signals")
    assert "| SLO attainment | 87.4% | 0% |" in text and "| goodput (requests/s) | 9.76 | 0 |" in text, text
    assert "the bound under 2 s" in text
    assert "| preemptions_per_s |" in text
    if charts_available():
        assert "![preemptions_per_s](chart-preemptions_per_s.png)" in text
        assert (tmp_path / "chart-preemptions_per_s.png").stat().st_size > 0
    else:
        assert "matplotlib is not installed" in text
    assert "pass --out DIR" in compare_markdown(doc, None)


def test_an_incident_carried_over_is_named_apart(doc: dict) -> None:
    """An incident that began before the after window and resolved in it is said to be carried over."""
    carried = {**doc, "incidents": {**doc["incidents"], "carried_over": ["queue_blocking"]}}
    buf = io.StringIO()
    render_compare(Console(file=buf, width=200, color_system=None), carried)
    assert "carried over into the after window, then resolved: queue_blocking" in buf.getvalue()
    assert "Carried over into the after window, then resolved: queue_blocking." in compare_markdown(carried, None)
    quiet = {**doc, "incidents": {**doc["incidents"], "carried_over": []}}
    assert "carried over" not in compare_markdown(quiet, None).lower()


def test_a_trade_off_is_styled_and_its_reasons_listed(doc: dict) -> None:
    """trade-off has a style of its own (bold yellow), and what was bought with what is on its own line."""
    reasons = ["goodput_rps 0 on both sides (no request met the SLO): the headline signals decide",
               "preemptions_per_s -100% bought with ttft_p95_seconds +98%", "preemptions_per_s -100% (better)"]
    traded = {**doc, "verdict": "trade-off", "verdict_reasons": reasons}
    assert VERDICT_STYLE["trade-off"] == "bold yellow"
    buf = io.StringIO()
    render_compare(Console(file=buf, width=200, color_system="truecolor", force_terminal=True), traded)
    assert "\x1b[1;33mverdict: trade-off" in buf.getvalue(), repr(buf.getvalue()[:600])
    md = compare_markdown(traded, None)
    assert md.startswith("# vllm-sentinel compare: trade-off")
    assert "## Verdict: trade-off\n\n* goodput_rps 0 on both sides" in md, md
    assert "* preemptions_per_s -100% bought with ttft_p95_seconds +98%" in md


def test_a_document_without_an_slo_block_still_renders(doc: dict) -> None:
    """A daemon from before the SLO block answers without one: no SLO lines, the rest as before."""
    older = {k: v for k, v in doc.items() if k != "slo"}
    buf = io.StringIO()
    render_compare(Console(file=buf, width=80, color_system=None), older)
    assert "SLO:" not in buf.getvalue() and "verdict: regressed" in buf.getvalue()
    assert "## SLO" not in compare_markdown(older, None)


def test_compares_prediction_sits_beside_what_was_measured_with_its_error(doc: dict) -> None:
    from rich.console import Console

    from vllm_sentinel.reports.compare_view import render_prediction

    block = {"changes": ["--num-gpu-blocks-override 8 -> 17"], "bound": 0.3, "withheld": None, "within_bound": True,
             "rows": [{"signal": "TTFT p95 s", "key": "ttft_p95_s", "predicted": 0.6, "measured": 0.71, "error": 0.155},
                      {"signal": "goodput req/s", "key": "goodput_rps", "predicted": 0.95, "measured": None,
                       "error": None}],
             "notes": ["ttft_p95_s: <as close as the buckets tell>"]}
    console = Console(record=True, width=100)
    render_prediction(console, {"prediction": block})
    text = console.export_text()
    assert "--num-gpu-blocks-override 8 -> 17" in text and "within the model's 30% bound" in text
    assert "0.71" in text and "16%" in text and "0.95" in text and "<as close as the buckets tell>" in text
    md = compare_markdown({**doc, "prediction": block}, None)
    assert "## Prediction" in md and "| TTFT p95 s | 0.6 | 0.71 | 16% |" in md and "&lt;as close" in md
    console = Console(record=True, width=200)
    render_prediction(console, {"prediction": {**block, "withheld": "the model does not represent a change of "
                                                                    "--dtype", "rows": [], "notes": []}})
    assert "withheld: the model does not represent a change of --dtype" in console.export_text()
    render_prediction(console, {"prediction": None})  # nothing changed: nothing printed
    assert console.export_text() == ""
    # an after window whose steps ran at another speed: the rows stay, the head says why nothing is judged
    unjudged = {**block, "within_bound": None, "unjudged": "the after window's engine steps took 2.65 ms <...>"}
    render_prediction(console, {"prediction": unjudged})
    text = console.export_text()
    assert "not judged: the after window's engine steps took 2.65 ms <...>" in text and "0.71" in text
    assert "within the model's" not in text and "outside the model's" not in text
    assert "not judged: the after window's engine steps took 2.65 ms &lt;...&gt;" in \
        compare_markdown({**doc, "prediction": unjudged}, None)
