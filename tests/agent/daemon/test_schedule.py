"""The sidecar's clock: jobs on their cadence, never overlapping themselves, skips counted, behind-schedule coalesced."""

from __future__ import annotations

import threading
import time

import pytest

from vllm_sentinel.agent.daemon.schedule import Schedule


def _wait(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_jobs_run_on_their_cadence_first_right_away():
    runs: dict[str, int] = {"fast": 0, "slow": 0}
    s = Schedule(4)
    s.add("fast", lambda: runs.__setitem__("fast", runs["fast"] + 1), 0.05)
    s.add("slow", lambda: runs.__setitem__("slow", runs["slow"] + 1), 3600)
    s.start()
    try:
        _wait(lambda: runs["fast"] >= 5 and runs["slow"] >= 1)
    finally:
        s.shutdown()
    assert runs["slow"] == 1  # its first run came right after start, the next is an hour away
    assert s.running is False


def test_a_job_still_running_when_due_is_skipped_and_counted_not_stacked():
    release = threading.Event()
    active, most, calls, skipped = [0], [0], [0], []

    def slow() -> None:
        calls[0] += 1
        active[0] += 1
        most[0] = max(most[0], active[0])
        if calls[0] == 1:
            release.wait(20)
        active[0] -= 1

    s = Schedule(4, on_skip=skipped.append)
    s.add("stalling", slow, 0.02)
    s.start()
    try:
        _wait(lambda: len(skipped) >= 5)
        assert calls[0] == 1  # nothing started beside the stalled run
        release.set()
        _wait(lambda: calls[0] >= 3)
    finally:
        release.set()
        s.shutdown()
    assert most[0] == 1 and set(skipped) == {"stalling"}


def test_a_job_behind_schedule_runs_once_then_keeps_its_cadence():
    now = [0.0]
    ran: list[float] = []
    s = Schedule(2, clock=lambda: now[0])
    s.add("j", lambda: ran.append(now[0]), 1.0, first_in_s=0.0)
    job = s._jobs["j"]
    s.start()
    try:
        _wait(lambda: ran == [0.0] and not job.running)
        now[0] = 10.5  # the host slept through ten runs
        s.wake()
        _wait(lambda: len(ran) == 2 and not job.running)
        assert job.due == pytest.approx(11.5)  # one run now, the next one interval later: no burst of ten
    finally:
        s.shutdown()


def test_remove_reschedule_and_names():
    s = Schedule(2)
    s.add("a", lambda: None, 5.0)
    with pytest.raises(ValueError, match="already scheduled"):
        s.add("a", lambda: None, 1.0)
    with pytest.raises(ValueError, match="positive"):
        s.add("b", lambda: None, 0)
    assert s.reschedule("a", 2.0) and s.every("a") == 2.0
    assert s.remove("a") and not s.remove("a") and not s.reschedule("a", 1.0) and s.every("a") is None
    s.shutdown()  # never started: nothing to wait for


def test_a_job_that_raises_keeps_its_schedule(caplog):
    calls = [0]

    def boom() -> None:
        calls[0] += 1
        raise RuntimeError("collector bug")

    s = Schedule(2)
    s.add("boom", boom, 0.02)
    s.start()
    try:
        _wait(lambda: calls[0] >= 3)
    finally:
        s.shutdown()
    assert "boom failed" in caplog.text
