"""The `rule_coverage` table: stretches of time over which the daemon evaluated a rule pack live.

The daemon evaluates its pack every few seconds and records what fires in the incidents table.
Over a stretch it covered, a replay of the same pack (same fingerprint) would find those same
incidents again at great cost: `diagnose` replays only the rest. A run is extended while
evaluations come at most `max_gap_ms` apart; a longer pause starts a new run, and the pause
between runs is replayed. Samples that arrive for a time already evaluated (a late write, an
ingested dump) clip the coverage back to before them.
"""

from __future__ import annotations

from typing import Any


def extend(store: Any, pack: str, t_ms: int, max_gap_ms: int, new_run: bool = False) -> None:
    """Record an evaluation of `pack` at t_ms: the run that ended at most max_gap_ms before grows, else
    (or with new_run) one starts."""
    cur = store.cursor()
    changed = None if new_run else cur.execute(
        "UPDATE rule_coverage SET end_ms = ? WHERE pack = ? AND end_ms >= ? AND end_ms <= ?",
        [t_ms, pack, t_ms - max_gap_ms, t_ms]).fetchone()
    if not changed or not changed[0]:
        cur.execute("INSERT INTO rule_coverage VALUES (?, ?, ?)", [pack, t_ms, t_ms])


def clip(store: Any, from_ms: int) -> None:
    """Samples at or after from_ms changed: no live evaluation (of any pack) covers them any more."""
    cur = store.cursor()
    cur.execute("DELETE FROM rule_coverage WHERE start_ms >= ?", [from_ms])
    cur.execute("UPDATE rule_coverage SET end_ms = ? WHERE end_ms >= ?", [from_ms - 1, from_ms])


def drop_before(cur: Any, cutoff_ms: int) -> None:
    """Retention: runs that ended before cutoff_ms (inside the caller's transaction)."""
    cur.execute("DELETE FROM rule_coverage WHERE end_ms < ?", [cutoff_ms])


def covered(store: Any, pack: str, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
    """The runs of `pack` overlapping [start_ms, end_ms], cut to it, in time order, overlapping runs merged."""
    rows = store.cursor().execute(
        "SELECT greatest(start_ms, ?), least(end_ms, ?) FROM rule_coverage WHERE pack = ? AND end_ms >= ? "
        "AND start_ms <= ? ORDER BY start_ms", [start_ms, end_ms, pack, start_ms, end_ms]).fetchall()
    out: list[tuple[int, int]] = []
    for a, b in rows:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((int(a), int(b)))
    return out


def gaps(spans: list[tuple[int, int]], start_ms: int, end_ms: int) -> list[tuple[int, int]]:
    """The parts of [start_ms, end_ms] outside the sorted, disjoint spans: (0,100) minus [(20,30)] -> (0,20), (30,100)."""
    out = []
    at = start_ms
    for a, b in spans:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < end_ms:
        out.append((at, end_ms))
    return out
