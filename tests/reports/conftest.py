"""Report tests: the `--regen-golden` flag (pytest tests/reports --regen-golden) rewrites goldens on purpose."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # report_goldens, shared with regenerate.py


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register --regen-golden (only when tests/reports is on the command line, or the root conftest adds it)."""
    try:
        parser.addoption("--regen-golden", action="store_true", default=False,
                         help="rewrite tests/reports/golden from the fixtures instead of comparing")
    except ValueError:
        pass  # already registered by a conftest higher up


@pytest.fixture
def regen_golden(request: pytest.FixtureRequest) -> bool:
    """True when this run rewrites goldens instead of comparing them."""
    try:
        return bool(request.config.getoption("--regen-golden"))
    except ValueError:
        return False
