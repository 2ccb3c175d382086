"""Tests only: named points inside the store's transactions where a test stops the process to kill it."""

from __future__ import annotations

import os
import sys
import threading

# read once at import: the test sets it in the environment of the process it starts
_STALL_AT = os.environ.get("VLLM_SENTINEL_TEST_STALL_AT")


def stall(point: str) -> None:
    """Block forever at `point` when VLLM_SENTINEL_TEST_STALL_AT names it (a test then kills -9 the process)."""
    if _STALL_AT == point:
        sys.stderr.write(f"stalled at {point}\n")
        sys.stderr.flush()
        threading.Event().wait()
