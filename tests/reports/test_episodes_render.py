"""The table and the Markdown of a diagnose document show each episode's roots first with their fixes,
the symptoms beneath marked with what explains them (on the recorded real session)."""

from __future__ import annotations

import pytest
from rich.console import Console

from vllm_sentinel.agent.demo.replay import run_replay
from vllm_sentinel.reports.console import render_incidents
from vllm_sentinel.reports.document import episodes_markdown


@pytest.fixture(scope="module")
def doc() -> dict:
    return run_replay()


def by_name(doc: dict, name: str) -> dict:
    [inc] = [i for i in doc["incidents"] if i["incident"] == name]
    return inc


def test_the_table_puts_the_roots_first_with_fixes_and_marks_the_symptoms(doc: dict) -> None:
    console = Console(record=True, width=400)
    render_incidents(console, doc["incidents"], doc["window"]["end"][:10])
    lines = console.export_text().splitlines()
    kv, queue = by_name(doc, "kv_cache_pressure"), by_name(doc, "queue_blocking")
    at = {name: next(n for n, line in enumerate(lines) if f" {name} " in line)
          for name in ("kv_cache_pressure", "queue_blocking", "ttft_slo_breach")}
    assert at["kv_cache_pressure"] < at["queue_blocking"] and at["kv_cache_pressure"] < at["ttft_slo_breach"]
    # the memory lever ranks first (more blocks for the same batch), not one sequence at a time
    assert lines[at["kv_cache_pressure"] + 2].strip() == "fix: --num-gpu-blocks-override 8 -> 19"
    assert lines[at["kv_cache_pressure"] + 3].strip().startswith("predicted: goodput")
    block = lines[at["queue_blocking"]:at["queue_blocking"] + 4]
    assert any(f"kv_cache_pressure {kv['id'][:12]}" in line and "explained by" in line for line in block)
    assert not any("fix:" in line for line in block)  # the cause's fix comes first, the symptom's stays in JSON
    assert queue["fixes"]  # ... where it still is: nothing is hidden
    assert lines[0].startswith(f"{len(doc['incidents'])} incident(s) in 1 episode(s)")


def test_the_markdown_lists_each_episode_roots_first(doc: dict) -> None:
    md = "\n".join(episodes_markdown(doc["incidents"]))
    kv = by_name(doc, "kv_cache_pressure")
    assert md.startswith("## Episodes")
    root = md.index(f"- **root** `kv_cache_pressure` (`{kv['id']}`")
    symptom = md.index("- `queue_blocking`")
    assert root < symptom
    assert "  - fix: `--num-gpu-blocks-override 8 -> 19`" in md[root:symptom]
    assert f"`kv_cache_pressure` (`{kv['id']}`)" in md[symptom:].split("\n")[1]
