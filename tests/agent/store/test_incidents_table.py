"""The incidents table: id-prefix lookup, upserts in one transaction, episodes overlapping a window."""

from __future__ import annotations

import duckdb
import pytest

from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.incidents_table import (firing_incident_rows, incidents_by_id_prefix,
                                                       incidents_overlapping, upsert_incidents)

T0 = 1_764_000_000_000


def row(iid: str, start: int, end: int | None = None, instance: str = "a:8000", rule: str = "queue_blocking") -> tuple:
    """A full incidents row in the table's column order."""
    state = "firing" if end is None else "resolved"
    return (iid, "queue_blocking", rule, "warning", instance, {"instance": instance}, "[]", start, end, state,
            2.0, start, 1.0, "queue grows", "{}", "[]", "[]", start)


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        upsert_incidents(s, [row("abc123", T0, T0 + 60_000), row("abd456", T0 + 30_000),
                             row("abc123ff", T0 + 90_000, instance="b:8000")])
        yield s


def test_an_exact_id_and_a_unique_prefix_both_find_the_incident(store):
    assert incidents_by_id_prefix(store, "abd") == [("abd456", T0 + 30_000)]
    # an exact id is found even though it is also the prefix of another id
    assert incidents_by_id_prefix(store, "abc123") == [("abc123", T0), ("abc123ff", T0 + 90_000)]


def test_an_ambiguous_prefix_lists_the_candidates_by_id_and_at_most_the_limit(store):
    assert [r[0] for r in incidents_by_id_prefix(store, "ab")] == ["abc123", "abc123ff", "abd456"]
    assert [r[0] for r in incidents_by_id_prefix(store, "ab", limit=2)] == ["abc123", "abc123ff"]
    assert incidents_by_id_prefix(store, "zz") == []


def test_upsert_replaces_an_episode_and_only_firing_ones_continue(store):
    assert sorted(r[2] for r in firing_incident_rows(store)) == [T0 + 30_000, T0 + 90_000]
    upsert_incidents(store, [row("abd456", T0 + 30_000, T0 + 120_000)])
    assert [r[2] for r in firing_incident_rows(store)] == [T0 + 90_000]
    assert len(incidents_by_id_prefix(store, "ab")) == 3  # replaced, not added


def test_a_failing_upsert_writes_nothing(store):
    bad = row("new1", T0)[:-1] + (None,)  # updated_ms is NOT NULL
    with pytest.raises(duckdb.Error):
        upsert_incidents(store, [row("new0", T0), bad])
    assert incidents_by_id_prefix(store, "new") == []


def test_episodes_overlapping_a_window(store):
    ids = lambda rows: [r[0] for r in rows]  # noqa: E731
    # ended at the window start: not in it; still firing: in every later window
    assert ids(incidents_overlapping(store, T0 + 60_000, T0 + 100_000)) == ["abd456", "abc123ff"]
    assert ids(incidents_overlapping(store, T0 - 1, T0 + 100_000)) == ["abc123", "abd456", "abc123ff"]
    assert ids(incidents_overlapping(store, T0 - 1, T0 + 100_000, instance="b:8000")) == ["abc123ff"]
    assert incidents_overlapping(store, T0 - 10, T0 - 1) == []
    first = incidents_overlapping(store, T0 - 1, T0)[0]
    assert first[5] == {"instance": "a:8000"} and first[8] == "resolved"
