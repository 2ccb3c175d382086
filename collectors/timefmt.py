"""Durations (`1h`, `90s`, `7d`) and times (RFC 3339 or a Unix timestamp) for the CLI."""

from __future__ import annotations

import re
from datetime import datetime, timezone

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration_ms(text: str) -> int:
    """'1h30m' -> 5_400_000; a bare number is seconds. Raises ValueError naming the accepted forms."""
    t = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return int(float(t) * 1000)
    pos, total = 0, 0.0
    for m in _DURATION.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS_MS[m.group(2)]
        pos = m.end()
    if pos != len(t) or not t:
        raise ValueError(f"{text!r} is not a duration; use forms like 90s, 15m, 1h, 1h30m, 7d")
    return int(total)


def parse_time_ms(text: str) -> int:
    """RFC 3339 ('2026-11-29T10:00:00Z') or a Unix timestamp in seconds -> ms since the epoch."""
    t = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return int(float(t) * 1000)
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time; use RFC 3339 (2026-11-29T10:00:00Z) or Unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)
