"""Render the report fixtures into their golden outputs: Markdown text and chart data as JSON.

Shared by the golden tests and by `python -m tests.reports.regenerate` (the on-purpose rewrite).
The clock is the fixture's `generated_ms`: nothing here reads the time.
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_sentinel.reports.markdown import ReportData
from vllm_sentinel.reports.write import prepare

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden"
CASES = ("queue_blocking", "kv_cache_pressure")


def load_fixture(name: str) -> ReportData:
    """The ReportData of fixture `name` (tests/reports/fixtures/<name>.json)."""
    return ReportData.from_dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def render_case(name: str) -> dict[Path, str]:
    """golden path -> expected text, for one fixture."""
    text, charts = prepare(load_fixture(name))
    return {GOLDEN / f"{name}.md": text,
            GOLDEN / f"{name}.charts.json": compact_json(charts)}


def regenerate(names: tuple[str, ...] = CASES) -> list[tuple[Path, str]]:
    """Rewrite the goldens; returns (path, 'created' | 'changed' | 'unchanged') for each."""
    GOLDEN.mkdir(exist_ok=True)
    done = []
    for name in names:
        for path, text in render_case(name).items():
            old = path.read_text() if path.exists() else None
            if old != text:
                path.write_text(text)
            done.append((path, "created" if old is None else "changed" if old != text else "unchanged"))
    return done


def compact_json(obj: object) -> str:
    """JSON with one [t, v] point per line: readable diffs, a quarter of the indent=1 size."""
    import re
    text = json.dumps(obj, indent=1, sort_keys=True)
    return re.sub(r"\[\n\s+(-?[\d.e+-]+),\n\s+([^\n\[\]{}]+?)\n\s+\]", r"[\1, \2]", text) + "\n"


def check_golden(path: Path, text: str, regen: bool) -> None:
    """Compare `text` with the golden at `path` byte for byte; with regen, rewrite it and say so (skip)."""
    import difflib

    import pytest
    if regen:
        changed = not path.exists() or path.read_text() != text
        path.write_text(text)
        if changed:
            pytest.skip(f"rewrote {path}: review `git diff` before committing")
        return
    assert path.exists(), f"{path} is missing: create it with `python -m tests.reports.regenerate`"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(path), "rendered now"))
        pytest.fail(f"{path.name} differs from the rendering (if intended: "
                    f"`python -m tests.reports.regenerate`, then review git diff):\n{diff[:6000]}")
