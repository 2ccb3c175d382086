"""kv_fragmentation as an outage, for real: short requests hold whole 128-token blocks and the rest wait.

A server of its own (agent/demo/scenarios.py `fragmentation_server_config`: 8 blocks of 128 tokens,
--max-num-seqs 64) and a `vllm-sentinel run` daemon watching it; 48 clients of ~16-token requests
(`scenarios.kv_fragmentation`). The daemon's `diagnose --format json` must label it kv_fragmentation,
high or critical, within 3 minutes of the load's start, with the held-vs-used arithmetic and a block
size the CPU backend accepts, and without a higher --max-num-seqs anywhere. Durations: README.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_sentinel.agent.demo import scenarios
from vllm_sentinel.agent.demo.vllm_server import VllmServer
from tests.integration.test_scenarios import (_ms, _wait_for_daemon, assert_traffic_served, diagnose, incidents_named,
                                             stop_daemon)

pytestmark = pytest.mark.integration

FRAGMENTATION_DETECTION_S = 180.0  # labelled within 3 minutes of the load's start


@pytest.fixture(scope="module")
def watched(tiny_model_dir: Path, server_log_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmServer, Path]]:
    """The fragmentation server, and the daemon watching it at 1 s."""
    server = VllmServer(scenarios.fragmentation_server_config(tiny_model_dir),
                        log_path=server_log_dir / "fragmentation.log")
    server.start()
    db = tmp_path_factory.mktemp("fragmentation") / "sentinel.duckdb"
    daemon = subprocess.Popen([sys.executable, "-m", "vllm_sentinel", "run", "--target", server.url, "--db", str(db),
                               "--interval", "1s", "--metrics-port", "0", "--scrape-timeout", "3s"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for_daemon(db, daemon)
        time.sleep(5)  # a few scrapes and the first configuration snapshot
        yield server, db
    finally:
        stop_daemon(daemon)
        server.stop()


def test_fragmentation_that_blocks_requests_is_an_outage(watched: tuple[VllmServer, Path],
                                                         record_property: Callable[[str, object], None]) -> None:
    server, db = watched
    run = scenarios.kv_fragmentation(server)
    doc = diagnose(SimpleNamespace(db=db), run)  # type: ignore[arg-type]
    record_property("incidents", sorted({(i["incident"], i["rule"]) for i in doc["incidents"]}))
    outages = [i for i in incidents_named(doc, "kv_fragmentation") if i["severity"] in ("high", "critical")]
    assert outages, f"no kv_fragmentation outage; incidents: {[(i['incident'], i['rule']) for i in doc['incidents']]}"
    inc = min(outages, key=lambda i: _ms(i["start"]))
    delay_s = (_ms(inc["start"]) - run.phase("load")) / 1000
    record_property("detection_delay_s", round(delay_s, 1))
    assert delay_s <= FRAGMENTATION_DETECTION_S, inc
    # the held-vs-used arithmetic: a full cache, a queue, few running, and far fewer tokens than held slots
    ev = {e["signal"]: e["value"] for e in inc["evidence"]}
    record_property("evidence", ev)
    assert ev["kv_usage"] >= 0.95 and ev["waiting"] >= 1, ev
    assert ev["running"] < scenarios.FRAGMENTATION_MAX_NUM_SEQS, ev
    assert ev["tokens_held"] < ev["running"] * 128 / 2, ev  # under half of each held 128-token block
    fixes = {f["param"]: f for f in inc["fixes"]}
    record_property("fixes", inc["fixes"])
    block = fixes["--block-size"]
    assert (block["current"], block["suggested"]) == ("128", "32"), block  # the CPU kernel's smallest
    assert "blocks x 128 = " in block["why"] and "slots" in block["why"], block
    seqs = fixes["--max-num-seqs"]
    assert seqs["suggested"] is None and seqs["why"].startswith("leave it: "), seqs
    # wherever queueing is labelled too, its fix never raises --max-num-seqs, and says why
    for q in incidents_named(doc, "queue_blocking"):
        for f in q["fixes"]:
            if f["param"] == "--max-num-seqs":
                assert f["suggested"] is None and f["why"].startswith("not raised: "), f
    assert_traffic_served(run)
