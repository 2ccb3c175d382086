"""The own port's /healthz and /readyz on a real Sidecar, a real DuckDB file and a real vLLM capture served on demand."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon import sidecar as sidecar_module
from vllm_sentinel.agent.daemon.sidecar import Sidecar, SidecarConfig
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.vllm import Response, VllmCollector

CAPTURE = Path(__file__).parents[2] / "collectors" / "fixtures" / "vllm-0.32.0-cpu-one-request.prom.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            body = r.read().decode()
            return r.status, json.loads(body) if r.headers["Content-Type"] == "application/json" else body
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        return e.code, json.loads(body) if e.headers["Content-Type"] == "application/json" else body


def wait_for(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition never met")


@pytest.fixture
def rig(tmp_path):
    """A sidecar whose one target answers only once the test lets it (the first collection is held)."""
    release = threading.Event()
    body = CAPTURE.read_bytes()

    def fetch(url: str, timeout: float, limit: int) -> Response:
        release.wait(30)
        return Response(200, "text/plain; version=0.0.4", body)

    store = Store.open(tmp_path / "s.duckdb")
    port = free_port()
    collector = VllmCollector("http://127.0.0.1:8000", fetch=fetch)
    s = Sidecar(store, [collector], SidecarConfig(interval_s=0.5, metrics_port=port, socket_path=None))
    s.start()
    yield s, port, release
    release.set()
    s.stop()
    store.close()


def test_live_at_once_ready_after_the_first_collection_and_unready_while_the_store_cannot_write(rig):
    s, port, release = rig
    code, doc = get(port, "/healthz")
    assert code == 200 and doc["ok"] and doc["checks"]["writer"]["ok"]
    code, doc = get(port, "/readyz")
    assert code == 503 and doc["checks"]["first_collection"] == {"ok": False, "detail": "waiting for vllm"}
    release.set()
    wait_for(lambda: get(port, "/readyz")[0] == 200)
    # the committer's state after a failed commit (disk full): batches are held, the sidecar is not recording
    s.committer.store_error = "IO Error: No space left on device"
    code, doc = get(port, "/readyz")
    assert code == 503 and doc["checks"]["store"] == {"ok": False, "detail": "IO Error: No space left on device"}
    assert get(port, "/healthz")[0] == 200  # alive all the same: a restart would not free the disk
    s.committer.store_error = None
    assert get(port, "/readyz")[0] == 200


def test_a_stuck_writer_fails_liveness(rig, monkeypatch):
    _s, port, _release = rig
    monkeypatch.setattr(sidecar_module, "WRITER_STUCK_S", 0.0)  # any wait now counts as a commit that never returns
    code, doc = get(port, "/healthz")
    assert code == 503 and not doc["checks"]["writer"]["ok"] and doc["checks"]["scheduler"]["ok"]


def test_metrics_are_still_served_and_other_paths_are_404(rig):
    _s, port, release = rig
    release.set()
    code, text = get(port, "/metrics")
    assert code == 200 and "vllm_sentinel_samples_stored_total" in text
    assert get(port, "/")[0] == 200
    code, text = get(port, "/favicon.ico")
    assert code == 404 and "/healthz" in text
