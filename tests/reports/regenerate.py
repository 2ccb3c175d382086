"""Rewrite the report goldens on purpose: `python -m tests.reports.regenerate`; review `git diff` after."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from report_goldens import regenerate  # noqa: E402


def main() -> int:
    """Regenerate every golden and say which files changed."""
    for path, what in regenerate():
        print(f"{what:9} {path}")
    print("review the changes with `git diff tests/reports/golden` before committing them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
