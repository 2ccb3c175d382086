"""Captures in the store and an incident's `profile`, from real vLLM py-spy recordings."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel.agent.captures import profile_of, save
from vllm_sentinel.agent.store import Store
from vllm_sentinel.collectors import pyspy as ps

FIXTURES = Path(__file__).parents[1] / "collectors" / "fixtures" / "pyspy"


def recorded(role: str, pid: int, incident_id: str | None, state: str = "R") -> ps.Capture:
    stacks = ps.parse_folded((FIXTURES / f"load-record-{role}.txt").read_text())
    return ps.Capture(capture_id=f"c-{role}", ts_ms=1_000, instance="a:8000", pid=pid, role=role, kind="record",
                      status="ok", stacks=stacks, incident_id=incident_id, process_state=state)


def test_saved_captures_become_the_incidents_profile():
    with Store.open(":memory:") as store:
        taken = ps.TargetCapture("http://a:8000", "a:8000", "ok", None,
                                 [recorded("engine_core", 11, "inc1"), recorded("worker", 12, "inc1", "T")])
        assert save(store, taken) == 2
        assert store.con.execute("SELECT count(*) FROM events WHERE kind = 'pyspy_capture'").fetchone()[0] == 2
        prof = profile_of(store, "inc1")
        assert profile_of(store, "other") is None
    assert prof["kind"] == "py-spy"
    by_role = {p["role"]: p for p in prof["processes"]}
    assert set(by_role) == {"engine_core", "worker"}
    assert by_role["worker"]["stopped"] is True and by_role["engine_core"]["stopped"] is False
    assert any("forward" in f["frame"] for f in by_role["worker"]["top_frames"])  # a worker runs the model
    assert prof["top_frames"] and all(f.split(":")[0] in ("engine_core", "worker") for f in prof["top_frames"])
