"""Durations and times as text: the CLI's forgiving forms, Prometheus' strict forms, Go's and RFC 3339.

Two duration grammars live here, each named for where it is written:

* the CLI's (`--since 1h30m`, `--interval 1.5s`, a bare number is seconds): `parse_cli_duration_ms`;
* Prometheus' (rule files, promtool tests, `parseDuration` in templates: whole numbers, units
  y w d h m s ms in that order): `parse_prometheus_duration_ms` and `format_prometheus_duration_ms`.

Go's time.Duration prints differently from Prometheus ('1m0s' where Prometheus writes '1m'):
`format_go_duration_ms`, for messages that copy promtool's.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

_CLI_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_CLI_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_PROMETHEUS_DURATION_RE = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_PROMETHEUS_UNITS_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_UNIX_SECONDS_RE = re.compile(r"\d+(\.\d+)?")
# beyond these a window or a time means a typo, and datetime cannot print it anyway
MAX_CLI_DURATION_MS = 1000 * 365 * 86_400_000  # `--since 100000d` means "all of it"
MAX_TIME_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z


def parse_cli_duration_ms(text: str) -> int:
    """'1h30m' -> 5_400_000, '1.5h' -> 5_400_000; a bare number is seconds. ValueError names the accepted forms."""
    t = text.strip()
    if _UNIX_SECONDS_RE.fullmatch(t):
        return _bounded_duration(text, float(t) * 1000)
    pos, total = 0, 0.0
    for m in _CLI_DURATION_RE.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _CLI_UNITS_MS[m.group(2)]
        pos = m.end()
    if pos != len(t) or not t:
        raise ValueError(f"{text!r} is not a duration; use forms like 90s, 15m, 1h, 1h30m, 7d")
    return _bounded_duration(text, total)


def _bounded_duration(text: str, ms: float) -> int:
    if ms > MAX_CLI_DURATION_MS:
        raise ValueError(f"{text!r} is longer than 1000 years; use forms like 90s, 15m, 1h, 7d")
    return int(ms)


def parse_prometheus_duration_ms(text: str) -> int:
    """Prometheus duration to milliseconds: '1m30s' -> 90000, '0' -> 0; ValueError otherwise."""
    text = str(text)
    if text == "0":
        return 0
    m = _PROMETHEUS_DURATION_RE.match(text)
    if not text or not m or not any(m.groups()):
        raise ValueError(f'not a valid duration string: "{text}" (use units y w d h m s ms, e.g. 1m30s)')
    return sum(int(g) * unit for g, unit in zip(m.groups(), _PROMETHEUS_UNITS_MS) if g)


def format_prometheus_duration_ms(ms: int) -> str:
    """Milliseconds as Prometheus prints a duration: 90000 -> '1m30s', 0 -> '0s', 7776000000 -> '90d'."""
    if ms == 0:
        return "0s"
    out = []
    # years and weeks only when exact, as Prometheus does (90d reads better than 12w6d)
    for unit, name, exact in ((365 * 86_400_000, "y", True), (7 * 86_400_000, "w", True),
                              (86_400_000, "d", False), (3_600_000, "h", False), (60_000, "m", False),
                              (1000, "s", False), (1, "ms", False)):
        if exact and ms % unit:
            continue
        if ms >= unit:
            out.append(f"{ms // unit}{name}")
            ms %= unit
    return "".join(out)


def format_go_duration_ms(ms: int) -> str:
    """Go's time.Duration.String for whole milliseconds: 60000 -> '1m0s', 1500 -> '1.5s', 0 -> '0s'."""
    if ms == 0:
        return "0s"
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms}ms"
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s = f"{rest // 1000}" + (f".{rest % 1000:03d}".rstrip("0") if rest % 1000 else "")
    if h:
        return f"{sign}{h}h{m}m{s}s"
    if m:
        return f"{sign}{m}m{s}s"
    return f"{sign}{s}s"


def parse_rfc3339_ms(text: str) -> int:
    """RFC 3339 text to ms since the epoch: '1970-01-01T00:00:01Z' -> 1000; no offset is UTC; ValueError else."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def parse_time_ms(text: str) -> int:
    """RFC 3339 ('2026-11-29T10:00:00Z') or a Unix timestamp in seconds -> ms since the epoch."""
    t = text.strip()
    try:
        ms = float(t) * 1000 if _UNIX_SECONDS_RE.fullmatch(t) else parse_rfc3339_ms(t)
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is not a time; use RFC 3339 (2026-11-29T10:00:00Z) or Unix seconds") from None
    if not 0 <= ms <= MAX_TIME_MS:
        raise ValueError(f"{text!r} is outside 1970..9999; use RFC 3339 (2026-11-29T10:00:00Z) or Unix seconds")
    return int(ms)


def iso_seconds(ms: int) -> str:
    """ms since the epoch as RFC 3339 UTC in whole seconds (milliseconds dropped): 1500 -> '1970-01-01T00:00:01Z'."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_precise(ms: int | None) -> str | None:
    """ms since the epoch as RFC 3339 UTC, with milliseconds when not whole seconds: 1500 -> '...:01.500Z'."""
    if ms is None:
        return None
    if ms % 1000 == 0:
        return iso_seconds(ms)
    s = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return s[:-4] + "Z"


def parse_span_ms(text: str, now_ms: int) -> tuple[int, int]:
    """'START..END' -> (start_ms, end_ms); each end a time or a duration before `now_ms`.

    parse_span_ms('2h..1h', 7_200_000) -> (0, 3_600_000), '1h..now' -> (3_600_000, 7_200_000);
    times as parse_time_ms reads them.
    ValueError names the accepted forms, and refuses an empty or reversed span.
    """
    parts = text.split("..")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise ValueError(f"{text!r} is not a window; use START..END with times or durations ago, "
                         "e.g. 2h..1h or 2026-11-29T10:00:00Z..2026-11-29T11:00:00Z")
    start, end = (_time_or_ago_ms(p, now_ms) for p in parts)
    if end <= start:
        raise ValueError(f"{text!r} ends before it starts; put the earlier time first (2h..1h)")
    return start, end


def _time_or_ago_ms(text: str, now_ms: int) -> int:
    """A time (RFC 3339, Unix seconds), 'now', or a duration before now: '1h' -> now_ms - 3_600_000."""
    t = text.strip()
    if t == "now":
        return now_ms
    if t[-1:].isalpha() and not t.upper().endswith("Z"):
        return now_ms - parse_cli_duration_ms(t)
    return parse_time_ms(t)
