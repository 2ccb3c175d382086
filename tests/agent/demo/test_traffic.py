"""traffic.py against a loopback stub of the OpenAI completions endpoint: bounds, counts, error tallies."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_sentinel.agent.demo.traffic import (
    BackgroundTraffic,
    TrafficError,
    TrafficPlan,
    burst,
    make_prompt,
    mixed,
    run_traffic,
    steady,
)


@dataclass
class StubState:
    """What the stub does and what it saw."""

    delay_s: float = 0.0
    fail_every: int = 0  # every k-th request (1-based arrival order) answers HTTP 500
    no_usage: bool = False
    bodies: list[dict] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: StubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn

        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.bodies.append(body)
                n = len(state.bodies)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                if state.delay_s:
                    time.sleep(state.delay_s)
                if self.path != "/v1/completions":
                    self._send(404, {"error": "not found"})
                elif state.fail_every and n % state.fail_every == 0:
                    self._send(500, {"error": "engine dead"})
                elif state.no_usage:
                    self._send(200, {"choices": [{"text": "x"}]})
                else:
                    usage = {"prompt_tokens": len(body["prompt"].split()) + 1,
                             "completion_tokens": body["max_tokens"]}
                    self._send(200, {"choices": [{"text": "x"}], "usage": usage})
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _send(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture
def stub() -> Iterator[tuple[str, StubState]]:
    state = StubState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def test_sends_exactly_the_planned_count_and_sums_usage(stub: tuple[str, StubState]) -> None:
    url, state = stub
    result = run_traffic(url, "tiny-llama", TrafficPlan(requests=10, concurrency=3, prompt_tokens=5, max_tokens=7))
    assert (result.sent, result.ok, result.failed) == (10, 10, 0)
    assert len(state.bodies) == 10
    assert result.prompt_tokens == 10 * 6  # the stub counts words + 1, as a BOS token
    assert result.completion_tokens == 10 * 7
    assert len(result.latencies_s) == 10
    body = state.bodies[0]
    assert body["model"] == "tiny-llama" and body["max_tokens"] == 7 and body["ignore_eos"] is True
    assert body["stream"] is False


def test_never_more_in_flight_than_concurrency(stub: tuple[str, StubState]) -> None:
    url, state = stub
    state.delay_s = 0.05
    result = run_traffic(url, "m", TrafficPlan(requests=12, concurrency=3))
    assert result.ok == 12
    assert 1 <= state.max_in_flight <= 3


def test_server_errors_are_counted_not_raised(stub: tuple[str, StubState]) -> None:
    url, state = stub
    state.fail_every = 3
    result = run_traffic(url, "m", TrafficPlan(requests=9, concurrency=1))
    assert (result.ok, result.failed) == (6, 3)
    assert all("HTTP 500" in e for e in result.errors) and len(result.errors) == 3
    assert result.completion_tokens == 6 * 16  # failed requests add no tokens


def test_response_without_usage_is_a_failure(stub: tuple[str, StubState]) -> None:
    url, state = stub
    state.no_usage = True
    result = run_traffic(url, "m", TrafficPlan(requests=2, concurrency=1))
    assert (result.ok, result.failed) == (0, 2)
    assert "without usage" in result.errors[0]


def test_unreachable_server_fails_each_request_and_ends() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_traffic(f"http://127.0.0.1:{port}", "m", TrafficPlan(requests=4, concurrency=2))
    assert (result.sent, result.ok, result.failed) == (4, 0, 4)
    assert "ConnectionRefusedError" in result.errors[0]


def test_request_timeout_is_a_failure(stub: tuple[str, StubState]) -> None:
    url, state = stub
    state.delay_s = 1.0
    result = run_traffic(url, "m", TrafficPlan(requests=1, request_timeout_s=0.2))
    assert (result.ok, result.failed) == (0, 1)
    assert "timed out" in result.errors[0].lower() or "Timeout" in result.errors[0]


def test_duration_bound_stops_an_open_ended_run(stub: tuple[str, StubState]) -> None:
    url, state = stub
    state.delay_s = 0.02
    result = run_traffic(url, "m", TrafficPlan(requests=None, duration_s=0.3, concurrency=2))
    assert result.sent > 0
    assert result.sent == result.ok + result.failed == len(state.bodies)
    sent_then = len(state.bodies)
    time.sleep(0.1)
    assert len(state.bodies) == sent_then  # nothing keeps sending after run_traffic returns


def test_count_bound_wins_over_a_long_duration(stub: tuple[str, StubState]) -> None:
    url, _ = stub
    result = run_traffic(url, "m", TrafficPlan(requests=3, duration_s=3600, concurrency=8))
    assert result.sent == 3


def test_mixed_pattern_sends_long_prompts_every_kth(stub: tuple[str, StubState]) -> None:
    url, state = stub
    result = run_traffic(url, "m", mixed(requests=8, long_prompt_tokens=50, long_every=4, prompt_tokens=5, concurrency=1))
    assert result.ok == 8
    lengths = [len(b["prompt"].split()) for b in state.bodies]
    assert lengths == [50, 5, 5, 5, 50, 5, 5, 5]  # one worker: arrival order is index order


def test_prompts_differ_per_request_so_prefix_caching_cannot_merge_them(stub: tuple[str, StubState]) -> None:
    url, state = stub
    run_traffic(url, "m", burst(requests=6, prompt_tokens=20))
    assert len({b["prompt"] for b in state.bodies}) == 6
    assert make_prompt(20, 1, seed=0) != make_prompt(20, 1, seed=1)


def test_patterns_have_the_documented_shape() -> None:
    assert burst(12).concurrency == 12 and burst(12).interval_s == 0
    light = steady(requests=5, interval_s=0.5)
    assert light.interval_s == 0.5 and light.concurrency == 2
    assert mixed().prompt_tokens_for(0) == 1000 and mixed().prompt_tokens_for(1) == 32


@pytest.mark.parametrize(
    "plan, message",
    [
        (TrafficPlan(requests=None, duration_s=None), "unbounded"),
        (TrafficPlan(requests=0), "requests must be"),
        (TrafficPlan(duration_s=-1), "duration_s must be positive"),
        (TrafficPlan(concurrency=0), "concurrency"),
        (TrafficPlan(max_tokens=0), "max_tokens"),
        (TrafficPlan(long_every=2), "long_prompt_tokens"),
    ],
)
def test_invalid_plans_are_refused(plan: TrafficPlan, message: str) -> None:
    with pytest.raises(TrafficError, match=message):
        run_traffic("http://127.0.0.1:1", "m", plan)


def test_non_http_url_is_refused() -> None:
    with pytest.raises(TrafficError, match="base_url"):
        run_traffic("127.0.0.1:8000", "m", TrafficPlan(requests=1))


def test_background_traffic_returns_the_result(stub: tuple[str, StubState]) -> None:
    url, _ = stub
    bg = BackgroundTraffic(url, "m", TrafficPlan(requests=4, concurrency=2)).start()
    result = bg.wait(timeout_s=30)
    assert bg.done() and result.ok == 4


def test_stop_ends_an_open_ended_run_and_progress_counts_meanwhile(stub: tuple[str, StubState]) -> None:
    url, state = stub
    state.delay_s = 0.02
    state.fail_every = 3
    bg = BackgroundTraffic(url, "m", TrafficPlan(requests=None, duration_s=3600, concurrency=2)).start()
    deadline = time.monotonic() + 30
    while (seen := bg.progress()).ok < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen.ok >= 4 and seen.failed >= 1 and "HTTP 500" in seen.errors[0]
    bg.stop()
    result = bg.wait(timeout_s=30)
    assert bg.done() and result.sent == result.ok + result.failed == len(state.bodies) >= seen.sent
    sent_then = len(state.bodies)
    time.sleep(0.1)
    assert len(state.bodies) == sent_then  # nothing is sent after stop's run returned
