"""Durations and times as text: each grammar under its own name, so '1.5h' and '1m30s' never mix."""

from __future__ import annotations

import pytest

from vllm_sentinel.collectors.timefmt import (format_go_duration_ms, format_prometheus_duration_ms, iso_precise,
                                              iso_seconds, parse_cli_duration_ms, parse_prometheus_duration_ms,
                                              parse_rfc3339_ms, parse_span_ms, parse_time_ms)


def test_the_cli_grammar_takes_fractions_and_bare_seconds() -> None:
    assert parse_cli_duration_ms("1h30m") == parse_cli_duration_ms("1.5h") == 5_400_000
    assert parse_cli_duration_ms("90") == 90_000
    with pytest.raises(ValueError, match="not a duration"):
        parse_cli_duration_ms("5minutes")


def test_the_prometheus_grammar_is_strict() -> None:
    assert parse_prometheus_duration_ms("1m30s") == 90_000
    for text in ("1.5h", "90", ""):
        with pytest.raises(ValueError, match="not a valid duration string"):
            parse_prometheus_duration_ms(text)


def test_prometheus_and_go_print_durations_differently() -> None:
    assert format_prometheus_duration_ms(60_000) == "1m"
    assert format_go_duration_ms(60_000) == "1m0s"


def test_iso_seconds_drops_milliseconds_iso_precise_keeps_them() -> None:
    assert iso_seconds(1_500) == "1970-01-01T00:00:01Z"
    assert iso_precise(1_500) == "1970-01-01T00:00:01.500Z"
    assert iso_precise(1_000) == "1970-01-01T00:00:01Z" and iso_precise(None) is None


def test_rfc3339_round_trips_and_parse_time_also_takes_unix_seconds() -> None:
    assert parse_rfc3339_ms(iso_precise(1_764_000_000_250)) == 1_764_000_000_250
    assert parse_time_ms("2026-11-29T10:00:00Z") == parse_time_ms("1795946400") == 1_795_946_400_000


def test_a_span_takes_times_and_durations_ago() -> None:
    now = parse_time_ms("2026-11-29T12:00:00Z")
    assert parse_span_ms("2h..1h", now) == (now - 7_200_000, now - 3_600_000)
    assert parse_span_ms("30m..now", now) == (now - 1_800_000, now)
    assert parse_span_ms("2026-11-29T10:00:00Z..2026-11-29T11:00:00Z", now)[1] == now - 3_600_000
    for bad, why in (("1h", "START..END"), ("1h..2h", "ends before"), ("soon..1h", "soon"), ("..", "START..END")):
        with pytest.raises(ValueError, match=why):
            parse_span_ms(bad, now)
