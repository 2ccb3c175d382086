"""The harness itself, against a real vLLM CPU server: traffic counts match /metrics, and a scenario's load
runs from a child process (scenario tests build on these; test_scenarios asserts what the documented
settings do: the 8 blocks' preemptions in kv_cache_pressure, --max-num-seqs queueing in the restarts)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_sentinel.agent.demo import traffic
from vllm_sentinel.agent.demo.traffic import TrafficPlan, TrafficResult
from vllm_sentinel.agent.demo.vllm_server import VllmServer, VllmServerConfig, VllmServerError

pytestmark = pytest.mark.integration

COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total")


def scrape(server: VllmServer) -> dict[str, float]:
    """Every sample of /metrics summed by sample name over its label sets (engines, finish reasons)."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def settled_scrape(server: VllmServer, before: dict[str, float], result: TrafficResult) -> dict[str, float]:
    """Scrape until the request counter has caught up with what the client saw (bounded: 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        after = scrape(server)
        done = delta(after, before, "vllm:request_success_total") >= result.ok
        if done or time.monotonic() > deadline:
            return after
        time.sleep(0.2)


@dataclass
class Watched:
    """What one run of traffic did: the client's result, counter deltas, and every mid-run poll."""

    result: TrafficResult
    deltas: dict[str, float]
    polls: list[dict[str, float]] = field(default_factory=list)  # deltas of counters, values of gauges


def drive_and_watch(server: VllmServer, plan: TrafficPlan) -> Watched:
    """Run `plan` in the background while polling /metrics; keep every poll taken while it ran.

    The poller shares two vCPUs with a busy vLLM and can be starved for seconds, so a test must not
    count on a poll landing at any given moment (CI once saw none while requests queued)."""
    before = scrape(server)
    run = traffic.BackgroundTraffic(server.url, server.model_name, plan).start()
    polls: list[dict[str, float]] = []
    while not run.done():
        now = scrape(server)
        polls.append({**now, "done": delta(now, before, "vllm:request_success_total")})
        time.sleep(0.1)
    result = run.wait(timeout_s=plan.request_timeout_s)
    after = settled_scrape(server, before, result)
    return Watched(result, {name: delta(after, before, name) for name in after}, polls)


def test_server_identifies_itself(vllm_server: VllmServer) -> None:
    assert vllm_server.is_running() and vllm_server.pid
    assert vllm_server.url == f"http://127.0.0.1:{vllm_server.port}"
    with urllib.request.urlopen(f"{vllm_server.url}/v1/models", timeout=10) as resp:
        models = json.loads(resp.read())
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]
    info = scrape(vllm_server)
    assert info.get("vllm:cache_config_info") == 1.0  # vLLM's own metrics, not just process ones
    assert vllm_server.startup_seconds is not None and vllm_server.log_path.exists()


@pytest.mark.parametrize(
    "plan",
    [
        traffic.steady(requests=8, concurrency=2, interval_s=0.05, prompt_tokens=24, max_tokens=12),
        traffic.burst(requests=6, prompt_tokens=40, max_tokens=20, seed=1),
        traffic.mixed(requests=8, long_prompt_tokens=600, long_every=4, concurrency=4, max_tokens=8, seed=2),
    ],
    ids=["steady", "burst", "mixed"],
)
def test_traffic_counts_match_server_metrics(
    vllm_server: VllmServer, plan: TrafficPlan, record_property: Callable[[str, object], None]
) -> None:
    watched = drive_and_watch(vllm_server, plan)
    result, deltas = watched.result, watched.deltas
    record_property("traffic_seconds", round(result.elapsed_s, 2))
    assert (result.ok, result.failed) == (plan.requests, 0), result.errors
    assert result.completion_tokens == plan.requests * plan.max_tokens  # ignore_eos: exact lengths
    assert deltas["vllm:prompt_tokens_total"] == result.prompt_tokens
    assert deltas["vllm:generation_tokens_total"] == result.completion_tokens
    assert deltas["vllm:request_success_total"] == result.ok
    assert deltas["vllm:num_preemptions_total"] == 0  # the default cache is far larger than this load


def test_startup_failure_names_the_problem_and_quotes_the_log(tiny_model_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    server = VllmServer(VllmServerConfig(model_dir=empty), log_path=tmp_path / "bad.log", startup_timeout_s=240)
    with pytest.raises(VllmServerError, match="exited with code") as info:
        server.start()
    assert str(tmp_path / "bad.log") in str(info.value)
    assert "not-a-model" in str(info.value)  # the log tail names the bad path
    assert not server.is_running()


def test_explicit_port_in_use_is_refused_before_starting(tiny_model_dir: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = VllmServer(VllmServerConfig(model_dir=tiny_model_dir), port=port, log_path=tmp_path / "x.log")
        with pytest.raises(VllmServerError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert server.pid is None  # nothing was spawned


def test_a_scenarios_load_runs_from_a_child_process(vllm_server: VllmServer) -> None:
    """The demo and the restart bench send their load from a child: the same run record as in-process."""
    from vllm_sentinel.agent.demo.child_load import run_in_child

    before = scrape(vllm_server)
    run = run_in_child("healthy", vllm_server, 6)
    assert run.traffic is not None and run.traffic.ok > 0 and run.traffic.failed == 0, run.traffic
    assert [name for name, _t in run.phases] == ["load", "settle"] and run.end_ms > run.phase("settle")
    served = delta(settled_scrape(vllm_server, before, run.traffic), before, "vllm:request_success_total")
    assert served == run.traffic.ok  # every request the child's clients saw answered, the server counted


def test_a_child_load_against_a_stopped_server_is_one_clear_error(tmp_path: Path) -> None:
    from vllm_sentinel.agent.demo.child_load import run_in_child
    from vllm_sentinel.agent.demo.scenarios import ScenarioError

    stopped = VllmServer(VllmServerConfig(model_dir=tmp_path), log_path=tmp_path / "x.log")
    with pytest.raises(ScenarioError, match="is not running; start it before kv_cache_pressure"):
        run_in_child("kv_cache_pressure", stopped, 5)
