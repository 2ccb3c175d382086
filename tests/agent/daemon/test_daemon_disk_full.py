"""The real daemon on a disk that fills up, then gets space back (a small tmpfs made by the test).

While the disk is full, `status` says so with the fix and the daemon's own /metrics show
`vllm_sentinel_store_writable 0`; collected batches are held in memory, not dropped. When space
returns, writing resumes by itself (DuckDB invalidates its connection on some of these failures:
the store reopens the file), the held ticks land once each, and no sample points at a series that
was never stored.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.agent.daemon.test_fault_targets import FaultTarget, free_port, metric_value
from tests.agent.daemon.test_sidecar import cli, start_daemon, wait_status
from vllm_sentinel.agent.store.db import Store


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs at tmp_path/disk (needs CAP_SYS_ADMIN, as CI has: it runs as root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()}): the full-disk test needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk has no byte left; returns it (delete it to give the space back)."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        try:  # the last partial MiB: down to the last block
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def test_a_full_disk_is_reported_held_and_recovered_without_loss(small_disk):
    healthy = FaultTarget("healthy")
    db, port = small_disk / "s.duckdb", free_port()
    proc = start_daemon(db, healthy.url, extra=("--metrics-port", str(port), "--nvml", "off"))
    name = f"vllm {healthy.instance}"
    try:
        wait_status(db, lambda d: any(c["name"] == name and c["last_ms"] for c in d["collectors"]), timeout=30)
        filler = fill(small_disk)
        full = wait_status(db, lambda d: not d["store"]["ok"], timeout=60)
        assert "Free space on its disk" in full["store"]["error"], full["store"]
        shown = cli("status", "--db", str(db))
        assert "store failing" in shown.stdout and "Free space" in shown.stdout, shown.stdout
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert metric_value(metrics, "vllm_sentinel_store_writable") == 0.0
        requests_while_full = healthy.requests
        wait_status(db, lambda d: d["store"]["held_batches"] >= 3, timeout=60)  # collected on, held in memory
        filler.unlink()
        back = wait_status(db, lambda d: d["store"]["ok"] and d["store"]["held_batches"] == 0, timeout=60)
        assert back["store"]["lost_batches"] == 0, back["store"]
        after = healthy.requests
        wait_status(db, lambda d: healthy.requests >= after + 3, timeout=30)  # and writing goes on
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        healthy.close()
    stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "Free space on its disk" in stderr, stderr

    with Store.open(db, read_only=True) as s:
        orphans = s.con.execute("SELECT count(*) FROM samples WHERE series_id NOT IN "
                                "(SELECT series_id FROM series)").fetchone()[0]
        doubled = s.con.execute("SELECT count(*) FROM (SELECT series_id, ts FROM samples GROUP BY ALL "
                                "HAVING count(*) > 1)").fetchone()[0]
        ticks = s.con.execute(
            "SELECT count(DISTINCT ts) FROM samples JOIN series USING (series_id) WHERE instance = ? "
            "AND metric = 'vllm:prompt_tokens_total'", [healthy.instance]).fetchone()[0]
    assert orphans == 0
    assert doubled == 0  # a commit DuckDB made durable before failing its checkpoint is not written twice
    # every answered scrape is stored once, those answered while the disk was full included (the last
    # one or two may have been answered after the daemon's final commit)
    assert ticks >= healthy.requests - 2, (ticks, healthy.requests, requests_while_full)
