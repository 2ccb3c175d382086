"""`vllm-sentinel capture` against the real vLLM CPU server: stacks of every process, stored."""

from __future__ import annotations

import json
import subprocess
import sys

from vllm_sentinel.agent.store.db import Store


def test_capture_takes_every_vllm_process_and_stores_the_stacks(vllm_server, tmp_path):
    db = tmp_path / "c.duckdb"
    res = subprocess.run([sys.executable, "-m", "vllm_sentinel", "capture", "--target", vllm_server.url,
                          "--db", str(db), "--format", "json"], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    roles = {p["role"] for p in doc["processes"] if p["status"] == "ok"}
    assert {"api_server", "engine_core"} <= roles, doc
    engine = next(p for p in doc["processes"] if p["role"] == "engine_core")
    assert engine["samples"] > 0 and engine["top_frames"]
    assert doc["stored"] == len(doc["processes"])
    with Store.open(db, read_only=True) as s:
        stored = s.con.execute("SELECT role, folded FROM captures WHERE status = 'ok'").fetchall()
        events = s.con.execute("SELECT count(*) FROM events WHERE kind = 'pyspy_capture'").fetchone()[0]
    assert {r for r, _ in stored} == roles and all("vllm" in f for r, f in stored if r == "engine_core")
    assert events == len(doc["processes"])


def test_capture_of_a_target_with_no_vllm_process_says_so(tmp_path):
    res = subprocess.run([sys.executable, "-m", "vllm_sentinel", "capture", "--target", "http://127.0.0.1:9",
                          "--db", str(tmp_path / "c.duckdb")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "no" in res.stderr.lower() and "127.0.0.1:9" in (res.stderr + res.stdout)
