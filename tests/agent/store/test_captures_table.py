"""The captures table: captures and their events stored together, and the reads a report and diagnose make."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.store.captures_table import (CAPTURE_COLUMNS, captures_around, captures_of_kinds,
                                                      folded_stacks_of, insert_captures)
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Event

T0 = 1_764_000_000_000


def capture(cid: str, ts: int, incident_id: str | None, kind: str = "dump", role: str = "engine_core",
            pid: int = 11, folded: str | None = "main;step 3\n", instance: str = "a:8000") -> dict:
    row = dict.fromkeys(CAPTURE_COLUMNS)
    row.update(capture_id=cid, ts=ts, instance=instance, incident_id=incident_id, pid=pid, role=role, kind=kind,
               status="ok", folded=folded)
    return row


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        insert_captures(s, [
            capture("c2", T0 + 2_000, "inc1", role="worker", pid=12),
            capture("c1", T0 + 1_000, "inc1"),
            capture("c3", T0 + 3_000, "inc1", kind="torch_profile", folded=None),
            capture("c4", T0 + 1_500, None),  # on demand, inside the incident's window
            capture("c5", T0 + 1_500, None, instance="b:8000"),
            capture("c6", T0 + 99_000, None),  # on demand, after the window
        ], [Event(T0 + 1_000, "a:8000", "pyspy_capture", {"status": "ok"}, "py-spy dump of engine_core")])
        yield s


def test_captures_and_their_events_are_stored_together(store):
    assert store.cursor().execute("SELECT count(*) FROM captures").fetchone()[0] == 6
    assert store.cursor().execute("SELECT count(*) FROM events WHERE kind = 'pyspy_capture'").fetchone()[0] == 1


def test_a_failing_capture_row_stores_neither_captures_nor_events(store):
    duplicate = capture("c1", T0, "inc2")  # capture_id is the primary key
    with pytest.raises(Exception):
        insert_captures(store, [capture("c9", T0, "inc2"), duplicate], [Event(T0, "a:8000", "pyspy_capture")])
    assert folded_stacks_of(store, "inc2") == []
    assert store.cursor().execute("SELECT count(*) FROM events").fetchone()[0] == 1


def test_profiler_traces_and_stacks_of_an_incident_are_read_apart(store):
    assert [r[1] for r in captures_of_kinds(store, "inc1", ["torch_profile", "nsys"])] == ["torch_profile"]
    # only rows holding stacks, oldest first
    assert [(pid, role) for pid, role, _, _ in folded_stacks_of(store, "inc1")] == [(11, "engine_core"),
                                                                                    (12, "worker")]


def test_a_report_sees_linked_captures_and_unlinked_ones_of_its_instance_in_the_window(store):
    rows = captures_around(store, "inc1", "a:8000", (T0, T0 + 60_000), except_kinds=["torch_profile"])
    assert [r["capture_id"] for r in rows] == ["c1", "c4", "c2"]
    assert rows[0]["folded"] == "main;step 3\n" and set(rows[0]) == set(CAPTURE_COLUMNS)
