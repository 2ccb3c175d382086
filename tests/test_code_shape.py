"""Small modules with one job: no module over 500 lines, no function over 80 unless it is a hot loop that says so."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "collectors", "reports", "bench", "scripts")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
# a long function may stay one function only where splitting it would cost a call per item of a hot
# loop; the comment above it must say so
HOT_LOOP_MARK = "hot loop"


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _long_functions(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        above = " ".join(lines[max(0, first - 4):first - 1]).lower()
        if length > MAX_FUNCTION_LINES and HOT_LOOP_MARK not in above:
            out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_the_scan_sees_the_code() -> None:
    # the limits below would pass on an empty list
    assert len(_modules()) > 100


def test_no_module_over_500_lines() -> None:
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, long


def test_no_function_over_80_lines_except_a_named_hot_loop() -> None:
    long = [f for p in _modules() for f in _long_functions(p)]
    assert not long, long


def test_the_function_check_catches_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\n\n# the scrape's hot loop\ndef g():\n{body}\n")
    assert _long_functions(tmp_path / "m.py", tmp_path) == [f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
