"""`diagnose`: incidents and a health summary over a window, in the design's JSON contract."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from vllm_sentinel.agent.store import Store
from vllm_sentinel.agent.summary import instances, summarize

# rules evaluation over a window, wired in by the caller once rules are loaded:
# (store, start_ms, end_ms, instance) -> incident dicts of the JSON contract
WindowEvaluator = Callable[[Store, int, int, str | None], list[dict]]


class NoDataInWindow(Exception):
    """The store holds no sample in the asked window."""


def iso(ms: int) -> str:
    """Milliseconds since the epoch as RFC 3339 UTC: 0 -> '1970-01-01T00:00:00Z'."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def diagnose(store: Store, start_ms: int, end_ms: int, instance: str | None = None, source: str = "",
             evaluate_window: WindowEvaluator | None = None) -> dict:
    """The diagnose document for (start_ms, end_ms]: window, source, instances, incidents, summary."""
    seen = instances(store, start_ms, end_ms)
    if instance is not None:
        seen = [i for i in seen if i == instance]
    if not seen:
        span = store.time_range()
        have = f"it holds {iso(span[0])} .. {iso(span[1])}" if span else "it is empty"
        wanted = f" for instance {instance}" if instance else ""
        raise NoDataInWindow(f"no samples{wanted} between {iso(start_ms)} and {iso(end_ms)} in {store.path}; "
                             f"{have}. Widen --since/--until or check --db.")
    incidents = evaluate_window(store, start_ms, end_ms, instance) if evaluate_window else []
    return {
        "window": {"start": iso(start_ms), "end": iso(end_ms)},
        "source": source or f"duckdb:{store.path}",
        "instances": seen,
        "incidents": incidents,
        "summary": [s.as_dict() for s in summarize(store, start_ms, end_ms, instance)],
    }
