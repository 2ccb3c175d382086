"""Each incident for real: the vLLM CPU server driven into it, the sidecar watching, `diagnose` naming it.

One server (agent/demo/scenarios.py settings) and one `vllm-sentinel run` daemon serve the whole module;
the tests run in file order: healthy first (a clean window), target_down last (it stops the
server). Each asserts on `vllm-sentinel diagnose --format json` over exactly its scenario's
window. Durations: tests/integration/README.md.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon import client
from vllm_sentinel.agent.demo import scenarios
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.agent.demo.scenarios import ScenarioRun
from vllm_sentinel.agent.demo.vllm_server import VllmServer

pytestmark = pytest.mark.integration


@dataclass
class Rig:
    """The shared server and the daemon watching it."""

    server: VllmServer
    db: Path
    daemon: subprocess.Popen[str]


def _wait_for_daemon(db: Path, daemon: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.call(socket_path_for(db), "/v1/health", timeout=1)
            return
        except client.ApiError:
            if daemon.poll() is not None:
                raise RuntimeError(f"vllm-sentinel run exited: {daemon.stderr.read() if daemon.stderr else ''}")
            if time.monotonic() > deadline:
                raise RuntimeError("vllm-sentinel run never answered on its API socket")
            time.sleep(0.3)


@pytest.fixture(scope="module")
def rig(tiny_model_dir: Path, server_log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    server = VllmServer(scenarios.scenario_server_config(tiny_model_dir), log_path=server_log_dir / "scenarios.log")
    server.start()
    db = tmp_path_factory.mktemp("scenarios") / "sentinel.duckdb"
    daemon = subprocess.Popen([sys.executable, "-m", "vllm_sentinel", "run", "--target", server.url, "--db", str(db),
                               "--interval", "1s", "--metrics-port", "0",
                               # a busy 2-core CI host answers /metrics in over 1 s at times; a failed scrape
                               # writes up=0, which would reset the `for` of rules that require up == 1
                               "--scrape-timeout", "3s"],
                              # its own session, as the README says to run it (autogroup: see test_sidecar_live)
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for_daemon(db, daemon)
        time.sleep(5)  # a few scrapes and the first configuration snapshot before any scenario
        yield Rig(server, db, daemon)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
        server.stop()


def running(rig: Rig) -> VllmServer:
    """The shared server, started again if an earlier test (target_down) stopped it."""
    if not rig.server.is_running():
        rig.server.start()
    return rig.server


def diagnose(rig: Rig, run: ScenarioRun) -> dict:
    """`vllm-sentinel diagnose --format json` over exactly the scenario's window (asks the running daemon)."""
    since = f"{(run.end_ms - run.start_ms) / 1000:.3f}s"
    until = f"{run.end_ms / 1000:.3f}"
    res = subprocess.run([sys.executable, "-m", "vllm_sentinel", "diagnose", "--since", since, "--until", until,
                          "--db", str(rig.db), "--format", "json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def incidents_named(doc: dict, incident: str) -> list[dict]:
    return [i for i in doc["incidents"] if i["incident"] == incident]


def assert_labelled_with_fix(doc: dict, run: ScenarioRun) -> list[dict]:
    """The scenario's incident is in the document, with evidence and at least one concrete fix each."""
    assert run.expected_incident is not None
    found = incidents_named(doc, run.expected_incident)
    seen = sorted({i["incident"] for i in doc["incidents"]})
    assert found, f"{run.name}: no {run.expected_incident} incident in {run.as_dict()}; incidents seen: {seen}"
    for inc in found:
        assert inc["instance"] == run_instance(doc), inc
        assert inc["evidence"], inc
        concrete = [f for f in inc["fixes"] if f.get("suggested") not in (None, "")]
        assert concrete, f"{inc['rule']}: no fix with a suggested value: {inc['fixes']}"
    return found


def run_instance(doc: dict) -> str:
    assert len(doc["instances"]) == 1, doc["instances"]
    return doc["instances"][0]


# Connection-level failures of the stdlib client: at 32 clients it reuses keep-alive connections the
# server has just closed (5% of requests measured); the server itself never answered with an error.
_CLIENT_RACES = ("BrokenPipeError", "ConnectionResetError", "RemoteDisconnected")


def assert_traffic_served(run: ScenarioRun) -> None:
    """The load really ran: 90% of requests succeeded, and no failure was an HTTP error of the server."""
    t = run.traffic
    assert t is not None and t.ok > 0, run.as_dict()
    assert t.failed <= max(1, t.sent // 10), t.errors
    assert all(any(r in e for r in _CLIENT_RACES) for e in t.errors), t.errors


def diagnosed(rig: Rig, record_property: Callable[[str, object], None],
              scenario: Callable[[VllmServer], ScenarioRun]) -> tuple[ScenarioRun, dict]:
    """Run one scenario on the shared server, diagnose exactly its window, and record its figures."""
    run = scenario(running(rig))
    doc = diagnose(rig, run)
    record_property("scenario_seconds", round(run.seconds, 1))
    record_property("incidents", sorted({i["incident"] for i in doc["incidents"]}))
    return run, doc


def test_healthy_light_load_fires_nothing(rig: Rig, record_property: Callable[[str, object], None]) -> None:
    run, doc = diagnosed(rig, record_property, scenarios.healthy)
    assert_traffic_served(run)
    assert run.traffic is not None and run.traffic.ok > 10, run.traffic
    assert rig.server.instance in doc["instances"]
    assert doc["incidents"] == [], [(i["incident"], i["summary"]) for i in doc["incidents"]]


def test_queue_blocking(rig: Rig, record_property: Callable[[str, object], None]) -> None:
    run, doc = diagnosed(rig, record_property, scenarios.queue_blocking)
    found = assert_labelled_with_fix(doc, run)
    assert_traffic_served(run)
    # requests queued while 4 sequences ran: the fix is about --max-num-seqs or replicas, from the live config
    params = {f["param"] for i in found for f in i["fixes"]}
    assert params & {"--max-num-seqs", "replicas"}, params


def test_kv_cache_pressure(rig: Rig, record_property: Callable[[str, object], None]) -> None:
    run, doc = diagnosed(rig, record_property, scenarios.kv_cache_pressure)
    found = assert_labelled_with_fix(doc, run)
    assert_traffic_served(run)
    fixes = [f for i in found for f in i["fixes"] if f["param"] == "--max-num-seqs" and f["suggested"]]
    # 8 blocks x 128 tokens cannot hold 4 requests of ~400 tokens: fewer sequences, from the real config
    assert fixes and all(f["current"] == "4" and int(f["suggested"]) < 4 for f in fixes), fixes


def test_engine_stall(rig: Rig, record_property: Callable[[str, object], None]) -> None:
    run, doc = diagnosed(rig, record_property, scenarios.engine_stall)
    assert run.detail["state_while_stopped"] == "T"  # really stopped, not just slow
    assert run.detail["frozen_with"]["vllm:num_requests_running"] > 0  # frozen with requests running
    found = assert_labelled_with_fix(doc, run)
    stopped, resumed = run.phase("stopped"), run.phase("resumed")
    # it fired while the engine was frozen (not before the SIGSTOP)
    assert any(_ms(i["start"]) >= stopped - 1000 and _ms(i["start"]) <= resumed + 5000 for i in found), found
    assert_traffic_served(run)  # requests in flight survived the stall
    assert rig.server.is_running()


def test_target_down(rig: Rig, record_property: Callable[[str, object], None]) -> None:
    run, doc = diagnosed(rig, record_property, scenarios.target_down)
    assert not rig.server.is_running()
    found = assert_labelled_with_fix(doc, run)
    assert all(_ms(i["start"]) >= run.phase("stopping") - 1000 for i in found), found


def _ms(iso_time: str) -> int:
    from datetime import datetime
    return int(datetime.fromisoformat(iso_time.replace("Z", "+00:00")).timestamp() * 1000)
