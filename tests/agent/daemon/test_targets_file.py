"""`run --targets-file` and `run --config` with the real daemon, real files, and loopback targets serving a real vLLM capture.

The file is rewritten while the daemon runs (atomically, as a ConfigMap update or a config tool
does): the added target starts, the removed one stops and its series end with stale markers,
a broken version leaves the running targets alone and shows in `status`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.daemon.test_sidecar import Target, cli, start_daemon, wait_for_api, wait_status
from vllm_sentinel.agent.store.db import Store


@pytest.fixture
def two_targets():
    a, b = Target(), Target()
    yield a, b
    a.close()
    b.close()


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def vllm_collectors(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["collectors"] if c["name"].startswith("vllm ")}


def last_values(db: Path, instance: str, metric: str) -> dict[str, float | None]:
    """The last stored value of each series of one metric of one instance (None: a stale marker)."""
    with Store.open(db, read_only=True) as s:
        rows = s.con.execute(
            "SELECT labels_text, value FROM samples JOIN series USING (series_id) "
            "WHERE instance = ? AND metric = ? ORDER BY ts", [instance, metric]).fetchall()
    return dict(rows)  # later rows overwrite earlier ones: the last value of each series


def test_targets_file_adds_and_removes_targets_and_carries_labels(tmp_path, two_targets):
    a, b = two_targets
    ia, ib = f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"
    targets = tmp_path / "targets.yaml"
    targets.write_text(f"- targets: ['{ia}']\n  labels: {{job: vllm, zone: eu-1}}\n")
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, extra=("--targets-file", str(targets)))
    try:
        doc = wait_status(db, lambda d: (vllm_collectors(d).get(f"vllm {ia}") or {}).get("last_ms"))
        assert [(t["instance"], t["source"], t["labels"]) for t in doc["targets"]] == [
            (ia, f"{targets}:1", {"job": "vllm", "zone": "eu-1"})]
        first_reload = doc["targets_file"]["last_reload_ms"]
        assert doc["targets_file"]["error"] is None

        write_atomically(targets, f"- targets: ['{ib}']\n  labels: {{job: vllm, zone: eu-2}}\n")
        doc = wait_status(db, lambda d: set(vllm_collectors(d)) == {f"vllm {ib}"}
                          and vllm_collectors(d)[f"vllm {ib}"]["last_ms"])
        assert doc["targets_file"]["last_reload_ms"] > first_reload
        assert doc["targets_file"]["reloads"] == {"ok": 1, "error": 0}
        assert [t["instance"] for t in doc["targets"]] == [ib]
        assert not any(c["name"] == f"process {ia}" for c in doc["collectors"])
    finally:
        stop(proc)
    # the removed target's series carry its labels and end with a stale marker; up included
    up_a = last_values(db, ia, "up")
    assert list(up_a) == ['job="vllm",zone="eu-1"'] and up_a['job="vllm",zone="eu-1"'] is None
    running_a = last_values(db, ia, "vllm:num_requests_running")
    assert running_a and all('zone="eu-1"' in labels and 'job="vllm"' in labels for labels in running_a)
    assert all(v is None for v in running_a.values())
    # the added one carries its own labels and was still live at the stop (no stale marker for it)
    running_b = last_values(db, ib, "vllm:num_requests_running")
    assert running_b and all('zone="eu-2"' in labels for labels in running_b)
    assert all(v is not None for v in running_b.values())


def test_a_broken_targets_file_keeps_the_running_targets_and_shows_in_status(tmp_path, two_targets):
    a, _b = two_targets
    ia = f"127.0.0.1:{a.port}"
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"targets": [ia], "labels": {"job": "vllm"}}]))
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, extra=("--targets-file", str(targets)))
    try:
        wait_status(db, lambda d: (vllm_collectors(d).get(f"vllm {ia}") or {}).get("last_ms"))
        write_atomically(targets, '[{"targets": ["%s"], "labels": {"job": "vllm"}},\n {"targets": ]}]' % ia)
        doc = wait_status(db, lambda d: d["targets_file"]["error"])
        assert doc["targets_file"]["error"].startswith(f"{targets}:2: not valid JSON")
        assert doc["targets_file"]["reloads"]["error"] == 1
        seen = vllm_collectors(doc)[f"vllm {ia}"]["last_ms"]
        doc = wait_status(db, lambda d: vllm_collectors(d)[f"vllm {ia}"]["last_ms"] > seen)  # still scraped
        table = " ".join(cli("status", "--db", str(db)).stdout.split())  # unwrapped
        assert "targets file reload failed, the running targets stay" in table and "not valid JSON" in table
        write_atomically(targets, json.dumps([{"targets": [ia], "labels": {"job": "vllm"}}]) + "\n")
        doc = wait_status(db, lambda d: d["targets_file"]["error"] is None)
        assert doc["targets_file"]["reloads"] == {"ok": 1, "error": 1}
    finally:
        stop(proc)


def test_config_file_sets_run_options_and_the_command_line_wins(tmp_path, two_targets):
    a, _b = two_targets
    ia = f"127.0.0.1:{a.port}"
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    (conf_dir / "targets.yaml").write_text(f"- targets: ['{ia}']\n")
    config = conf_dir / "sentinel.yaml"
    config.write_text("targets-file: targets.yaml   # relative to this file\n"
                      "interval: 2s\n"
                      "scrape_timeout: 1s\n"
                      "metrics-port: 0\n"
                      "retention: 1d\n")
    db = tmp_path / "s.duckdb"
    args = [sys.executable, "-m", "vllm_sentinel", "run", "--config", str(config), "--db", str(db),
            "--interval", "0.5s"]
    proc = wait_for_api(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), db)
    try:
        doc = wait_status(db, lambda d: (vllm_collectors(d).get(f"vllm {ia}") or {}).get("last_ms"))
        assert doc["interval_s"] == 0.5  # the command line over the file's 2s
        assert doc["targets_file"]["path"] == str(conf_dir / "targets.yaml")
    finally:
        stop(proc)


@pytest.mark.parametrize("config, targets, expected", [
    ("interval: 1x\n", None, "sentinel.yaml:1: interval: '1x' is not a duration"),
    ("interval: 1s\nscrape_timout: 3s\n", None, "sentinel.yaml:2: scrape_timout: not an option of `run` (did you mean scrape-timeout?)"),
    ("metrics-port: [9464]\n", None, "sentinel.yaml:1: metrics-port: expects one number, not list"),
    ("target: {url: x}\n", None, "sentinel.yaml:1: target: give one value or a list of values"),
    ("interval: 1s\ninterval: 2s\n", None, "sentinel.yaml:2: interval: given twice (also"),
    ("- interval: 1s\n", None, "sentinel.yaml:1: the config must be a mapping of run options"),
    ("target: [ftp://x]\n", None, "sentinel.yaml:1: target 'ftp://x' is not an http(s) URL"),
    ("cpu-budget: 300%\nmetrics-port: 0\ntarget: [http://127.0.0.1:1]\n", None, "sentinel.yaml:1: --cpu-budget"),
    ("targets-file: t.yaml\n", "- targets: [127.0.0.1:1]\n  labels: {job: [a]}\n",
     "t.yaml:2: label job must have a string value"),
    ("targets-file: t.yaml\n", "- targets: [127.0.0.1:1]\n  lables: {job: a}\n",
     "t.yaml:2: unknown key 'lables' in a target group"),
    ("targets-file: t.yaml\n", "- targets: [127.0.0.1:1, 127.0.0.1:1]\n", "t.yaml:1: instance 127.0.0.1:1 is already listed"),
    ("targets-file: t.yaml\n", "", "t.yaml: the targets file is empty; write [] to mean no targets"),
    ("targets-file: t.yaml\n", "[]\n", "no target: pass --target URL, or a --targets-file that lists at least one target"),
    ("targets-file: missing.yaml\n", None, "missing.yaml: cannot read the targets file"),
])
def test_bad_config_or_targets_file_is_one_line_naming_file_line_and_fix(tmp_path, config, targets, expected):
    (tmp_path / "sentinel.yaml").write_text(config)
    if targets is not None:
        (tmp_path / "t.yaml").write_text(targets)
    res = cli("run", "--config", str(tmp_path / "sentinel.yaml"), "--db", str(tmp_path / "s.duckdb"),
              "--metrics-port", "0")
    assert res.returncode in (1, 2), res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert expected in lines[0], lines[0]
