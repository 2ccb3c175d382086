"""Hostile values (from a scraped server's labels, argv, errors) reach the report as inert text, never as markup."""

from __future__ import annotations

import re
from dataclasses import replace

from report_goldens import load_fixture

from vllm_sentinel.reports.document import diagnose_markdown
from vllm_sentinel.reports.mdescape import escape_md, escape_md_with_code, fenced
from vllm_sentinel.reports.write import prepare

HOSTILE = "x\n# owned\n<img src=x onerror=alert(1)> | *b* [l](http://e) `c` _u_ & ```"


def _hostile_report() -> str:
    data = load_fixture("queue_blocking")
    inc = {**data.incident, "instance": HOSTILE, "summary": HOSTILE, "severity": HOSTILE,
           "labels": {**data.incident.get("labels", {}), "model_name": HOSTILE}}
    cfg = replace(data.config, model=HOSTILE, flags={**data.config.flags, "--served-model-name": HOSTILE},
                  source=HOSTILE)
    text, _ = prepare(replace(data, incident=inc, config=cfg, source=HOSTILE, missing=[f"Evidence `{HOSTILE}`: x"]))
    return text


def _outside_code_blocks(text: str) -> str:
    """The Markdown with fenced blocks dropped (their content is literal), each closing on its own fence."""
    out, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            out.append(line)
    assert fence is None, "a code block never closed"
    return "\n".join(out)


def test_hostile_values_start_no_heading_no_html_and_break_no_table() -> None:
    text = _outside_code_blocks(_hostile_report())
    assert not re.search(r"^#+ owned", text, re.M)  # an escaped newline never becomes a heading
    assert "<img" not in text.replace("`<img", "")  # HTML only ever inside a code span, where it is literal
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "\\*b\\*" in text and "\\[l\\]" in text
    for block in re.findall(r"(?:^\|.*\|$\n?)+", text, re.M):  # every table keeps its column count
        rows = block.strip().splitlines()
        widths = {len(re.findall(r"(?<!\\)\|", r)) for r in rows}
        assert len(widths) == 1, block
    assert "## Suggested fix" in text and "## What was not checked" in text  # no section swallowed


def test_escape_md_examples() -> None:
    assert escape_md("a|b\nc") == "a\\|b c"
    assert escape_md("<b>&") == "&lt;b&gt;&amp;"
    assert escape_md("# x") == "\\# x" and escape_md("1. x") == "1\\. x" and escape_md("- x") == "\\- x"
    assert escape_md("snake_case") == "snake_case" and escape_md("_em_") == "\\_em\\_"
    assert escape_md("x_y", code=True) == "`x_y`" and escape_md("a`b", code=True) == "a\\`b"
    assert escape_md_with_code("run `pip install x` now") == "run `pip install x` now"
    assert fenced(["a ``` b"], "text") == ["````text", "a ``` b", "````"]


def test_diagnose_markdown_escapes_instances_and_signals() -> None:
    doc = {"window": {"start": "2026-11-29T10:00:00Z", "end": "2026-11-29T11:00:00Z"}, "source": HOSTILE,
           "instances": [HOSTILE], "incidents": [], "summary": [{"instance": HOSTILE, "signals": {HOSTILE: 1.0}}]}
    text = diagnose_markdown(None, doc)
    assert not re.search(r"^#+ owned", text, re.M) and "<img" not in text.replace("`<img", "")
