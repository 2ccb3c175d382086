"""The demo's progress lines: time since the start and time left, from the plan of stages."""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.demo.live import LIVE_SEQUENCE, demo_plan
from vllm_sentinel.agent.demo.progress import Progress, clock_text


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_each_line_says_time_in_and_time_left_as_the_plan_advances():
    said: list[str] = []
    clock = Clock()
    p = Progress(said.append, [("server", 60), ("load", 120), ("reports", 30)], clock=clock)
    p("starting")
    clock.t += 20
    p("still starting")
    clock.t += 70  # the server took 90 s of its 60: it counts as done, the rest of the plan is left
    p("late")
    p.begin("load")
    clock.t += 30
    p("loading")
    assert said == ["[0:00 in, ~3:30 left] starting", "[0:20 in, ~3:10 left] still starting",
                    "[1:30 in, ~2:30 left] late", "[2:00 in, ~2:00 left] loading"]


def test_an_unknown_stage_is_refused():
    with pytest.raises(KeyError, match="no stage 'verify'"):
        Progress(lambda _m: None, [("server", 60)]).begin("verify")


def test_the_demo_plan_holds_each_incident_as_long_as_asked():
    names = [n for n, _ in demo_plan()]
    assert names[:2] == ["model", "server"] and names[2:2 + len(LIVE_SEQUENCE)] == LIVE_SEQUENCE
    assert names[-3:] == ["restart", "verify", "reports"]
    short, default = sum(s for _, s in demo_plan(30)), sum(s for _, s in demo_plan())
    assert short < default
    # every incident held 30 s instead of its default: the plan shrinks by exactly the difference
    from vllm_sentinel.agent.demo.scenarios import DEFAULT_HOLD_S
    holds = LIVE_SEQUENCE + [LIVE_SEQUENCE[-1]]
    assert default - short == pytest.approx(sum(DEFAULT_HOLD_S[n] - 30 for n in holds))


def test_clock_text():
    assert (clock_text(0), clock_text(59.6), clock_text(125.4), clock_text(-3)) == ("0:00", "1:00", "2:05", "0:00")
