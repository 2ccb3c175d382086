"""The Markdown report: golden files from fixed fixtures (byte for byte), and the rules behind each section."""

from __future__ import annotations

from dataclasses import replace

import pytest
from report_goldens import CASES, check_golden, load_fixture, render_case

from vllm_sentinel.reports.markdown import (ConfigSnapshot, ReportData, duration, format_with_unit, render_markdown,
                                            serve_command)
from vllm_sentinel.reports.write import prepare


@pytest.mark.parametrize("name", CASES)
def test_report_matches_golden(name: str, regen_golden: bool) -> None:
    for path, text in render_case(name).items():
        if path.suffix == ".md":
            check_golden(path, text, regen_golden)


def test_rendering_twice_gives_the_same_bytes() -> None:
    data = load_fixture("kv_cache_pressure")
    assert prepare(data) == prepare(data)


def test_fixture_round_trips_through_dict() -> None:
    data = load_fixture("kv_cache_pressure")
    assert ReportData.from_dict(data.to_dict()) == data


def test_sections_come_in_the_order_an_operator_reads_them() -> None:
    text, _ = prepare(load_fixture("queue_blocking"))
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert heads == ["## Timeline", "## Evidence", "## Charts", "## Configuration at the time",
                     "## Suggested fix", "## Stack evidence", "## Related incidents", "## What was not checked"]
    assert text.startswith("# queue_blocking on 127.0.0.1:8000 (critical, still firing)\n")


def test_fix_is_a_before_after_vllm_serve_line() -> None:
    text, _ = prepare(load_fixture("kv_cache_pressure"))
    assert ("- vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.9 --max-model-len 8192 "
            "--max-num-seqs 256\n+ vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.9 "
            "--max-model-len 8192 --max-num-seqs 128\n") in text
    assert "117,968 / 920" in text  # the arithmetic is shown, not only the verdict


def test_fix_without_config_still_shows_the_changed_flag() -> None:
    data = replace(load_fixture("queue_blocking"), config=None)
    text, _ = prepare(data)
    assert "- vllm serve tiny-llama --max-num-seqs 2\n+ vllm serve tiny-llama --max-num-seqs 8\n" in text
    assert "No configuration snapshot was recorded" in text


def test_advice_in_words_is_not_put_on_the_command_line() -> None:
    data = load_fixture("queue_blocking")
    fix = {"param": "--max-num-seqs", "current": "2", "suggested": "raise it", "why": "slots are full"}
    text = render_markdown(replace(data, fixes=[fix]))
    assert "```diff" not in text and "no command line to change" in text
    assert "**`--max-num-seqs` 2 → raise it**" in text


def test_replicas_and_environment_fixes_stay_off_the_vllm_serve_line() -> None:
    data = load_fixture("queue_blocking")
    fixes = [{"param": "replicas", "current": "1", "suggested": "5", "why": "demand 13 / 3 per replica"},
             {"param": "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "current": "300", "suggested": "60", "why": "hang"}]
    text = render_markdown(replace(data, fixes=fixes))
    assert "**`replicas` 1 → 5**" in text and "**`VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS` 300 → 60**" in text
    assert "```diff" not in text and "replicas 5" not in text


def test_the_command_line_changes_one_setting_the_first_flag_fix() -> None:
    """Change one parameter, then verify: two flag fixes (ranked memory first) put only the first on the line."""
    data = replace(load_fixture("queue_blocking"), config=None)
    fixes = [{"param": "replicas", "current": "1", "suggested": "3", "why": "demand"},
             {"param": "--num-gpu-blocks-override", "current": "8", "suggested": "19", "why": "memory"},
             {"param": "--max-num-seqs", "current": "4", "suggested": "1", "why": "fewer sequences"}]
    text = render_markdown(replace(data, fixes=fixes))
    assert ("- vllm serve tiny-llama --num-gpu-blocks-override 8\n"
            "+ vllm serve tiny-llama --num-gpu-blocks-override 19\n") in text
    assert "--max-num-seqs 1" not in text and "The first of these that is a flag, `--num-gpu-blocks-override`" in text


def test_resolved_incident_has_end_and_duration_firing_one_says_so() -> None:
    resolved, _ = prepare(load_fixture("kv_cache_pressure"))
    assert "| resolved | 2026-11-29 10:33:30 UTC |" in resolved and "| duration | 9m 30s |" in resolved
    firing, _ = prepare(load_fixture("queue_blocking"))
    assert "| resolved | not yet (still firing" in firing and "| duration | 5m so far |" in firing


def test_peak_is_read_inside_the_incident_window_only() -> None:
    data = load_fixture("kv_cache_pressure")
    signal = "preemptions_per_s"
    # a higher spike before the incident must not be reported as its peak
    labels, pts = data.evidence_series[signal][0]
    spiked = [(t, 99.0 if i == 3 else v) for i, (t, v) in enumerate(pts)]
    data.evidence_series[signal] = [(labels, spiked)] + data.evidence_series[signal][1:]
    text, _ = prepare(data)
    peak = next(ln for ln in text.splitlines() if ln.startswith("| peak |"))
    assert "99" not in peak and "2.4" in peak


def test_missing_data_and_failed_captures_are_listed() -> None:
    q, _ = prepare(load_fixture("queue_blocking"))
    assert "- GPU counters: no NVML" in q and "- Stacks: py-spy is not installed" in q
    kv, _ = prepare(load_fixture("kv_cache_pressure"))
    assert "Capture failed (permission_denied)" in kv and "CAP_SYS_PTRACE" in kv
    assert "Nothing: metrics, GPU counters, stacks and configuration were all available." in kv


def test_evidence_without_samples_gets_no_chart_and_says_so() -> None:
    data = load_fixture("queue_blocking")
    data.evidence_series["kv_cache_usage_max"] = []
    text, charts = prepare(data)
    assert "kv_cache_usage_max" not in [c["signal"] for c in charts]
    assert "chart-kv_cache_usage_max.png" not in text
    assert "| `kv_cache_usage_max` | 3.1 % | 90 % | ratio | no samples |" in text


def test_table_cells_escape_pipes() -> None:
    data = load_fixture("queue_blocking")
    data.related[0]["summary"] = "a | b"
    assert "a \\| b" in render_markdown(data)


@pytest.mark.parametrize("value,unit,text", [
    (0.0042, "s", "4.2 ms"), (6.1, "s", "6.1 s"), (0.97, "ratio", "97 %"), (85, "%", "85 %"),
    (75_161_927_680, "B", "70 GiB"), (512, "B", "512 B"), (2.4, "1/s", "2.4/s"), (None, "s", "n/a"), (float("nan"), "", "n/a"), (2.0, "", "2"),
])
def test_format_with_unit(value: float | None, unit: str, text: str) -> None:
    assert format_with_unit(value, unit) == text


def test_duration_and_serve_command() -> None:
    assert duration(272_000) == "4m 32s" and duration(3_723_000) == "1h 2m 3s" and duration(0) == "0s"
    assert serve_command("m x", {"--max-num-seqs": "256", "--block-size": "16"}, {"--block-size"}, []) \
        == "vllm serve 'm x' --max-num-seqs 256"


def test_config_table_marks_defaults() -> None:
    data = replace(load_fixture("queue_blocking"),
                   config=ConfigSnapshot(ts_ms=0, source="flags", flags={"--max-num-seqs": "2", "--block-size": "128"},
                                         defaulted={"--block-size"}))
    text = render_markdown(data)
    assert "| `--block-size` | 128 | vLLM default |" in text and "| `--max-num-seqs` | 2 | command line |" in text


def test_a_fix_without_current_value_takes_it_from_the_snapshot() -> None:
    data = load_fixture("queue_blocking")
    data.fixes = [{**data.fixes[0], "current": None}]
    text = render_markdown(data)
    assert "**`--max-num-seqs` 2 → 8**" in text and "- vllm serve /home/op/.cache/vllm-sentinel/tiny-llama " \
        "--max-model-len 512 --max-num-seqs 2\n" in text


def test_unknown_config_values_are_grouped_by_reason() -> None:
    data = load_fixture("queue_blocking")
    data.config.unknown = {"num_layers": "model config.json not given", "head_dim": "model config.json not given",
                           "platform": "platform not known"}
    text = render_markdown(data)
    assert "- `head_dim`, `num_layers`: model config.json not given\n" in text
    assert "- `platform`: platform not known\n" in text


@pytest.mark.parametrize("name", CASES)
def test_report_parses_as_markdown_with_every_table_and_image_intact(name: str) -> None:
    from markdown_it import MarkdownIt  # CommonMark + GFM tables, as a GitHub preview renders them
    data = load_fixture(name)
    text, charts = prepare(data)
    html = MarkdownIt("commonmark").enable("table").render(text)
    separators = sum(1 for ln in text.splitlines() if ln.startswith("|---") or ln.startswith("|--:"))
    assert html.count("<table>") == separators
    assert html.count("<img ") == len(charts)
    assert html.count("<h2>") == 8
