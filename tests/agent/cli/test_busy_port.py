"""`run` with a --metrics-port another process holds: one line naming the port and the fix, before anything starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon.wiring import check_metrics_port


@pytest.fixture
def busy_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


def test_a_busy_port_is_refused_naming_it_and_the_option(busy_port: int) -> None:
    with pytest.raises(ValueError, match=rf"--metrics-port {busy_port}: cannot listen on 127.0.0.1:{busy_port}"):
        check_metrics_port(busy_port)


def test_a_free_port_passes() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    check_metrics_port(port)  # nothing holds it now: no error


def test_run_stops_before_watching_when_the_port_is_busy(busy_port: int, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    proc = subprocess.run([sys.executable, "-m", "vllm_sentinel", "run", "-t", "http://127.0.0.1:9", "--db", str(db),
                           "--metrics-port", str(busy_port), "--duration", "1s"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "watching" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert f"--metrics-port {busy_port}" in line and "choose another with --metrics-port" in line
    assert not db.exists()  # nothing was started: no store created
