"""The daemon end to end against a loopback HTTP target serving a real vLLM capture.

The target misbehaves on command (down, slow, garbage) to prove the daemon keeps running, records
`up 0` with the error, and recovers. The daemon is the real `vllm-sentinel run` process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon import client
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.agent.daemon.sidecar import Sidecar, SidecarConfig
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch

CAPTURE = Path(__file__).parents[2] / "collectors" / "fixtures" / "vllm-0.32.0-cpu-one-request.prom.txt"


class Target:
    """A loopback /metrics server whose behaviour a test switches: ok, slow, garbage, 500."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.body = CAPTURE.read_bytes()
        target = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if target.mode == "slow":
                    time.sleep(3)
                body = b"<html>not metrics</html>\n" if target.mode == "garbage" else target.body
                self.send_response(500 if target.mode == "error" else 200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:
                    pass

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target():
    t = Target()
    yield t
    t.close()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_sentinel", *args], capture_output=True, text=True,
                          timeout=timeout)


def start_daemon(db: Path, *targets: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    args = [sys.executable, "-m", "vllm_sentinel", "run", "--db", str(db), "--interval", "0.5s",
            "--scrape-timeout", "1s", "--metrics-port", "0", *extra]
    for t in targets:
        args += ["--target", t]
    return wait_for_api(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), db)


def wait_for_api(proc: subprocess.Popen, db: Path, timeout: float = 30) -> subprocess.Popen:
    """The daemon `proc` once it answers on the API socket of `db`; killed, and the test failed, when it never does."""
    sock = socket_path_for(db)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.call(sock, "/v1/health", timeout=1)
            return proc
        except client.ApiError:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited: {proc.stderr.read()}")
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("daemon API never answered")


def wait_status(db: Path, predicate, timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    doc = {}
    while time.monotonic() < deadline:
        doc = client.call(socket_path_for(db), "/v1/status")
        if predicate(doc):
            return doc
        time.sleep(0.25)
    raise AssertionError(f"status never matched: {json.dumps(doc)}")


def up_values(db: Path) -> list[float]:
    with Store.open(db, read_only=True) as s:
        return [r[0] for r in s.con.execute(
            "SELECT value FROM samples JOIN series USING (series_id) WHERE metric = 'up' ORDER BY ts").fetchall()]


def test_daemon_survives_a_misbehaving_target_and_recovers(tmp_path, target):
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, f"http://127.0.0.1:{target.port}")
    try:
        ok = lambda d: d["collectors"][0]["ok"] and d["collectors"][0]["last_ms"]  # noqa: E731
        wait_status(db, ok)
        for mode, why in (("slow", "no complete answer within 1 s"), ("garbage", "did not return Prometheus metrics"), ("error", "HTTP 500")):
            target.mode = mode
            doc = wait_status(db, lambda d: not d["collectors"][0]["ok"])
            assert why in doc["collectors"][0]["error"], doc
            assert proc.poll() is None
            target.mode = "ok"
            wait_status(db, ok)
        # `status` from the CLI shows the same, through the socket
        res = cli("status", "--db", str(db), "--format", "json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["collectors"][0]["ok"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read()
    ups = up_values(db)
    assert 0.0 in ups and ups[-1] == 1.0  # the outage is recorded and so is the recovery
    with Store.open(db, read_only=True) as s:
        errors = [r[0] for r in s.con.execute("SELECT message FROM events WHERE kind = 'scrape_error'").fetchall()]
    assert any("no complete answer" in e for e in errors) and any("HTTP 500" in e for e in errors)


def test_dead_target_is_up_0_with_a_fix_and_sigint_stops_cleanly(tmp_path):
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, "http://127.0.0.1:9")  # discard port: nothing listens
    try:
        doc = wait_status(db, lambda d: d["collectors"][0]["last_ms"] is not None)
        assert "refused" in doc["collectors"][0]["error"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert set(up_values(db)) == {0.0}
    assert not socket_path_for(db).exists()  # the API socket is removed on a clean stop


def test_diagnose_reads_through_the_daemon_while_it_holds_the_file(tmp_path, target):
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, f"http://127.0.0.1:{target.port}")
    try:
        wait_status(db, lambda d: d["collectors"][0]["ok"] and d["collectors"][0]["last_ms"])
        time.sleep(1.5)
        res = cli("diagnose", "--since", "5m", "--db", str(db), "--format", "json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["source"].startswith("daemon:")
        assert doc["instances"] == [f"127.0.0.1:{target.port}"]
        assert doc["incidents"] == []
        assert doc["summary"][0]["series"] > 100
        assert oct(os.stat(socket_path_for(db)).st_mode & 0o777) == "0o600"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # with the daemon gone the CLI opens the file read-only itself
    res = cli("diagnose", "--since", "5m", "--db", str(db), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["source"] == f"duckdb:{db}"


def test_diagnose_on_an_empty_window_names_what_the_store_holds(tmp_path):
    db = tmp_path / "s.duckdb"
    Store.open(db).close()
    res = cli("diagnose", "--since", "1h", "--db", str(db))
    assert res.returncode == 1
    assert "no samples" in res.stderr and "it is empty" in res.stderr


def test_diagnose_without_a_database_says_how_to_make_one(tmp_path):
    res = cli("diagnose", "--db", str(tmp_path / "none.duckdb"))
    assert res.returncode == 1
    assert "does not exist" in res.stderr and "vllm-sentinel run" in res.stderr


def test_bad_duration_is_a_usage_error(tmp_path):
    res = cli("diagnose", "--since", "an hour", "--db", str(tmp_path / "x.duckdb"))
    assert res.returncode == 2 and "not a duration" in res.stderr


def test_a_wrong_rule_file_stops_the_daemon_at_start_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n    fore: 1m\n")
    res = cli("run", "--target", "http://127.0.0.1:9", "--db", str(tmp_path / "s.duckdb"), "--rules", str(bad),
              "--metrics-port", "0", "--duration", "1s")
    assert res.returncode == 1
    assert f"{bad}:6" in res.stderr and "fore" in res.stderr


def test_diagnose_finds_an_incident_in_an_ingested_dump_with_the_operators_rules(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: Preempting\n"
        "    expr: sum by (instance) (rate(vllm:num_preemptions_total[1m])) > 0.1\n    for: 1m\n"
        "    labels: {incident: kv_cache_pressure, severity: high}\n"
        "    annotations: {summary: '{{ $labels.instance }} preempts'}\n")
    t0 = 1_795_946_400  # seconds
    lines = []
    for i in range(600):  # 10 minutes at 1 s; preemptions from minute 3 to minute 7
        n = 0 if i < 180 else min(i, 420) - 180
        lines.append(f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {n} {(t0 + i) * 1000}')
    dump = tmp_path / "dump.prom"
    dump.write_text("\n".join(lines) + "\n")
    db = tmp_path / "s.duckdb"
    assert cli("ingest", str(dump), "--instance", "a:8000", "--db", str(db)).returncode == 0
    res = cli("diagnose", "--since", "10m", "--until", str(t0 + 600), "--db", str(db), "--rules", str(rules),
              "--format", "json")
    assert res.returncode == 0, res.stderr
    (inc,) = json.loads(res.stdout)["incidents"]
    assert (inc["incident"], inc["instance"], inc["summary"]) == ("kv_cache_pressure", "a:8000", "a:8000 preempts")
    assert inc["state"] == "resolved"


DOWN_RULE = (
    "groups:\n- name: g\n  rules:\n  - alert: Down\n    expr: up == 0\n    for: 1s\n"
    "    labels: {incident: target_down, severity: critical}\n"
    "    annotations: {summary: '{{ $labels.instance }} does not answer'}\n"
    "    evidence:\n    - {signal: up, expr: up, threshold: 1, unit: ''}\n")


def daemon_with_a_report(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path, list[str]]:
    """A daemon watching a dead port with a 1 s `up == 0` rule, once its first report is written."""
    rules = tmp_path / "down.yaml"
    rules.write_text(DOWN_RULE)
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, "http://127.0.0.1:9", extra=("--eval-interval", "1s", "--rules", str(rules)))
    deadline = time.monotonic() + 60
    reports: list[str] = []
    while time.monotonic() < deadline and not reports:
        time.sleep(0.5)
        reports = client.call(socket_path_for(db), "/v1/status")["reports"]
    return proc, db, rules, reports


def test_the_daemon_writes_a_report_when_an_incident_fires(tmp_path):
    proc, db, _rules, reports = daemon_with_a_report(tmp_path)
    proc.terminate()
    proc.wait(timeout=30)
    assert reports, "no report was written"
    md = Path(reports[0])
    assert md.parent.parent == tmp_path / "s.duckdb.reports"
    text = md.read_text()
    assert "127.0.0.1:9 does not answer" in text and "target_down" in text
    assert list(md.parent.glob("*.png"))


def test_markdown_diagnosis_and_report_while_the_daemon_holds_the_file(tmp_path):
    proc, db, rules, _reports = daemon_with_a_report(tmp_path)
    try:
        res = cli("diagnose", "--since", "2m", "--db", str(db), "--rules", str(rules), "--format", "markdown")
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("# vllm-sentinel diagnosis")
        assert "127.0.0.1:9 does not answer" in res.stdout
        doc = json.loads(cli("diagnose", "--since", "2m", "--db", str(db), "--rules", str(rules),
                             "--format", "json").stdout)
        iid = doc["incidents"][0]["id"]
        res = cli("report", iid[:8], "--db", str(db), "--out", str(tmp_path / "out"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert res.returncode == 0, res.stderr
    md = Path(res.stdout.splitlines()[0])
    assert md.is_file() and md.parent.parent == tmp_path / "out"


def test_params_file_overrides_thresholds_and_unknown_names_are_refused(tmp_path):
    good = tmp_path / "p.yaml"
    good.write_text("queue_time_p95_seconds: 5\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("queue_time_p95: 5\n")
    db = tmp_path / "s.duckdb"
    target = Target()
    try:
        assert cli("ingest", str(CAPTURE), "--db", str(db), "--instance", "a:1").returncode == 0
    finally:
        target.close()
    res = cli("diagnose", "--since", "100000d", "--db", str(db), "--params", str(good), "--format", "json")
    assert res.returncode == 0, res.stderr
    res = cli("diagnose", "--since", "100000d", "--db", str(db), "--params", str(bad))
    assert res.returncode == 1 and "queue_time_p95" in res.stderr and str(bad) in res.stderr


def test_the_daemon_applies_the_values_of_the_clis_params_file(tmp_path):
    rules = tmp_path / "down.yaml"  # by default `up == 5`: never true, so the daemon itself opens nothing
    rules.write_text("params: {down_value: 5}\n" + DOWN_RULE.replace("expr: up == 0", "expr: up == ${down_value}"))
    down = tmp_path / "down-params.yaml"
    down.write_text("down_value: 0\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("down_valu: 0\n")
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, "http://127.0.0.1:9", extra=("--rules", str(rules)))
    try:
        wait_status(db, lambda d: d["collectors"][0]["last_ms"] is not None)
        base = ("diagnose", "--since", "2m", "--db", str(db), "--rules", str(rules), "--format", "json")
        deadline, found = time.monotonic() + 120, []
        while time.monotonic() < deadline and not found:  # until the `up 0` samples outlast the rule's `for`
            res = cli(*base, "--params", str(down))  # the daemon evaluates with the values the CLI read
            assert res.returncode == 0, res.stderr
            doc = json.loads(res.stdout)
            found = [i["incident"] for i in doc["incidents"]]
        assert doc["source"].startswith("daemon:") and found == ["target_down"]
        res = cli(*base)  # the same samples with the rule file's own value: nothing
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["incidents"] == []
        res = cli(*base, "--params", str(unknown))
        assert res.returncode == 1 and "down_valu" in res.stderr and str(unknown) in res.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class StallingCollector:
    """Answers at once, except that its third collection blocks for `stall_s` (a CPU-starved sidecar)."""

    name = "stalling"

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.calls = 0

    def collect(self, now_ms: int) -> Batch:
        self.calls += 1
        if self.calls == 3:
            time.sleep(self.stall_s)
        batch = Batch(instance="fake:1", ts_ms=now_ms)
        batch.add("up", "", 1.0)
        return batch


def test_a_collection_that_starts_late_shows_in_the_gap_histogram(tmp_path):
    collector = StallingCollector(stall_s=2.5)
    with Store.open(tmp_path / "g.duckdb") as store:
        sidecar = Sidecar(store, [collector], SidecarConfig(interval_s=0.2, metrics_port=None))
        sidecar.start()
        time.sleep(4.0)
        sidecar.stop()
    reg = sidecar.metrics.registry

    def value(suffix: str, **labels: str) -> float:
        return reg.get_sample_value(f"vllm_sentinel_collection_gap_seconds_{suffix}", {"target": "stalling", **labels})

    count = value("count")
    assert count == collector.calls - 1 and count >= 4  # one gap per collection after the first
    assert value("bucket", le="0.5") >= 3  # the collections on time are about one interval apart
    assert count - value("bucket", le="2.0") >= 1  # the one after the stall started at least 2.5 s later
    # while it stalled, the due collections were skipped, not stacked behind it
    assert reg.get_sample_value("vllm_sentinel_collections_skipped_total", {"target": "stalling"}) >= 1


LINKED_RULES = DOWN_RULE + (
    "    explains:\n    - {incidents: [queue_blocking], equal: [instance]}\n"
    "  - alert: Waiting\n    expr: up == 0\n    for: 1s\n"
    "    labels: {incident: queue_blocking, severity: high}\n"
    "    annotations: {summary: '{{ $labels.instance }} queues'}\n")


def test_diagnose_links_episodes_through_the_daemon_and_from_the_file(tmp_path):
    rules = tmp_path / "linked.yaml"
    rules.write_text(LINKED_RULES)
    db = tmp_path / "s.duckdb"
    proc = start_daemon(db, "http://127.0.0.1:9", extra=("--eval-interval", "1s", "--rules", str(rules)))
    docs = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not docs:
            time.sleep(0.5)
            res = cli("diagnose", "--since", "2m", "--db", str(db), "--format", "json")  # the daemon's own rules
            doc = json.loads(res.stdout) if res.returncode == 0 else {"incidents": []}
            docs = [doc] if len(doc["incidents"]) == 2 else []
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert docs, "the daemon never had both incidents"
    res = cli("diagnose", "--since", "2m", "--db", str(db), "--rules", str(rules), "--format", "json")
    assert res.returncode == 0, res.stderr
    docs.append(json.loads(res.stdout))
    assert docs[0]["source"].startswith("daemon:") and docs[1]["source"] == f"duckdb:{db}"
    for doc in docs:
        down, waiting = doc["incidents"]  # the root first
        assert (down["incident"], down["caused_by"]) == ("target_down", [])
        assert (waiting["incident"], waiting["caused_by"]) == ("queue_blocking", [down["id"]])
        assert down["episode"] == waiting["episode"]
