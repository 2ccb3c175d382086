"""Incidents sent to Alertmanager: the alert's shape and timing, and a real Alertmanager (Debian's
prometheus-alertmanager 0.25) receiving them from the real daemon."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon import alertmanager as am
from vllm_sentinel.agent.diagnosis.incidents import Incident
from vllm_sentinel.agent.alerts.rulefile import parse_rule_text

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_alertmanager = pytest.mark.skipif(ALERTMANAGER is None,
                                        reason="Alertmanager (Debian package prometheus-alertmanager) not installed")

RULE = parse_rule_text("""
groups:
- name: g
  rules:
  - alert: QueueBlocking
    expr: vllm:num_requests_waiting > 2
    labels: {incident: queue_blocking, severity: critical}
    annotations: {summary: "10 requests waiting"}
""", "t.yaml").groups[0].rules[0]
T0 = 1_795_946_400_000  # 2026-11-29T10:00:00Z


def incident(start_ms: int = T0, end_ms: int | None = None, instance: str = "a:8000") -> Incident:
    inc = Incident(RULE, {"alertname": "QueueBlocking", "incident": "queue_blocking", "severity": "critical",
                          "instance": instance}, start_ms, end_ms, annotations={"summary": "10 requests waiting"})
    inc.fixes = [{"param": "--max-num-seqs", "current": "256", "suggested": "128", "why": "..."}]
    return inc


class Recorder:
    """Stands in for Alertmanager's HTTP API in the timing tests: keeps every posted batch."""

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []
        self.event = threading.Event()

    def __call__(self, url: str, body: bytes, timeout_s: float) -> None:
        self.batches.append(json.loads(body))
        self.event.set()


def sent_after(notifier: am.AlertmanagerNotifier, rec: Recorder, step) -> list[dict]:
    before = len(rec.batches)
    step()
    notifier.close()
    return [a for b in rec.batches[before:] for a in b]


def test_an_alert_carries_the_incident_its_id_and_its_fix():
    inc = incident()
    alert = am.to_alert(inc, T0 + 30_000, valid_ms=240_000)
    assert alert["labels"] == {"alertname": "QueueBlocking", "incident": "queue_blocking", "severity": "critical",
                               "instance": "a:8000"}
    assert alert["annotations"] == {"summary": "10 requests waiting", "incident_id": inc.id,
                                    "report": f"vllm-sentinel report {inc.id}", "fix": "--max-num-seqs 256 -> 128"}
    # firing: valid a few resend periods ahead, so Alertmanager resolves it if the sidecar dies
    assert (alert["startsAt"], alert["endsAt"]) == ("2026-11-29T10:00:00Z", "2026-11-29T10:04:30Z")
    resolved = am.to_alert(incident(end_ms=T0 + 90_000), T0 + 95_000, valid_ms=240_000)
    assert resolved["endsAt"] == "2026-11-29T10:01:30Z"


def test_firing_is_sent_at_once_then_every_resend_period_and_resolved_for_15_minutes():
    rec = Recorder()
    n = am.AlertmanagerNotifier(["http://am:9093"], resend_s=60, post=rec)
    inc = incident()
    n.after_evaluation(T0, [inc], [])
    n.after_evaluation(T0 + 5_000, [inc], [])  # not yet due again
    n.after_evaluation(T0 + 60_000, [inc], [])  # resend
    inc.end_ms = T0 + 70_000
    n.after_evaluation(T0 + 70_000, [], [inc])  # resolved: at once
    n.after_evaluation(T0 + 75_000, [], [])
    n.after_evaluation(T0 + 130_000, [], [])  # resolved again, in case the first did not arrive
    n.after_evaluation(T0 + 70_000 + 15 * 60_000 + 1, [], [])  # retention over: nothing more
    n.close()
    ends = [a["endsAt"] for b in rec.batches for a in b]
    assert ends == ["2026-11-29T10:04:00Z", "2026-11-29T10:05:00Z", "2026-11-29T10:01:10Z", "2026-11-29T10:01:10Z"]
    assert n.status["http://am:9093/api/v2/alerts"]["sent"] == 4


def test_a_dead_alertmanager_is_a_status_and_never_blocks_evaluation():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    counted: list[tuple[str, str, int]] = []
    n = am.AlertmanagerNotifier([f"http://127.0.0.1:{port}"], count=lambda *a: counted.append(a), timeout_s=2)
    n.after_evaluation(T0, [incident(), incident(instance="b:8000")], [])
    n.close()
    status = n.status[f"http://127.0.0.1:{port}/api/v2/alerts"]
    assert status["failed"] == 2 and status["sent"] == 0
    assert "did not answer" in status["last_error"] and "is Alertmanager running there?" in status["last_error"]
    assert counted == [(f"http://127.0.0.1:{port}/api/v2/alerts", "failed", 2)]


def test_a_stuck_alertmanager_drops_the_oldest_batches_and_counts_them():
    release = threading.Event()
    started = threading.Event()

    def stuck(url: str, body: bytes, timeout_s: float) -> None:
        started.set()
        release.wait(10)

    n = am.AlertmanagerNotifier(["http://am:9093"], resend_s=0, post=stuck)
    n.after_evaluation(T0, [incident()], [])
    assert started.wait(5)
    t0 = time.monotonic()
    for i in range(1, am.QUEUE_MAX + 11):  # 10 batches more than the queue holds
        n.after_evaluation(T0 + i * 1000, [incident()], [])
    assert time.monotonic() - t0 < 1  # evaluation never waits for Alertmanager
    release.set()
    n.close()
    assert n.status["http://am:9093/api/v2/alerts"]["dropped"] == 10


@pytest.mark.parametrize("url", ["am:9093", "ftp://am:9093", "http://"])
def test_a_wrong_url_names_the_fix(url):
    with pytest.raises(am.AlertmanagerError, match="e.g. http://127.0.0.1:9093"):
        am.alerts_url(url)
    assert am.alerts_url("http://am:9093/prefix/") == "http://am:9093/prefix/api/v2/alerts"


# -- a real Alertmanager ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def alertmanager(tmp_path: Path):
    """A real Alertmanager on loopback, clustering off, a receiver that delivers nowhere."""
    config = tmp_path / "am.yml"
    config.write_text("route:\n  receiver: none\n  group_wait: 1s\nreceivers:\n- name: none\n")
    port = free_port()
    log = open(tmp_path / "am.log", "w")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'am-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"Alertmanager did not start: {(tmp_path / 'am.log').read_text()[-2000:]}")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)
    log.close()


def alerts_in(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/api/v2/alerts", timeout=5) as resp:
        return json.loads(resp.read())


def wait_for(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


@needs_alertmanager
def test_the_daemon_sends_a_firing_incident_and_its_resolution_to_a_real_alertmanager(tmp_path, alertmanager):
    from tests.agent.daemon.test_sidecar import DOWN_RULE, Target, cli, start_daemon
    from vllm_sentinel.agent.daemon import client
    from vllm_sentinel.agent.daemon.paths import socket_path_for

    target = Target()
    target.mode = "error"  # /metrics answers 500: up 0, and the rule fires
    rules = tmp_path / "down.yaml"
    rules.write_text(DOWN_RULE)
    db = tmp_path / "s.duckdb"
    metrics_port = free_port()
    proc = start_daemon(db, f"http://127.0.0.1:{target.port}",
                        # the incident's report is asserted below: no budget defers it on a busy host
                        # (tests/agent/daemon/test_cpu_budget.py tests the deferral)
                        extra=("--eval-interval", "1s", "--rules", str(rules), "--alertmanager", alertmanager,
                               "--metrics-port", str(metrics_port), "--cpu-budget", "100%"))
    try:
        [alert] = wait_for(lambda: alerts_in(alertmanager), "the alert in Alertmanager")
        assert alert["labels"]["alertname"] == "Down" and alert["labels"]["incident"] == "target_down"
        assert alert["labels"]["instance"] == f"127.0.0.1:{target.port}"
        assert alert["annotations"]["summary"] == f"127.0.0.1:{target.port} does not answer"
        assert alert["status"]["state"] == "active"
        iid = alert["annotations"]["incident_id"]
        target.mode = "ok"  # the target answers again: the incident resolves, and so does the alert
        wait_for(lambda: not alerts_in(alertmanager), "the alert to resolve")
        status = client.call(socket_path_for(db), "/v1/status")["alertmanager"][alertmanager + "/api/v2/alerts"]
        assert status["sent"] >= 2 and status["failed"] == 0, status
        def status_with_report() -> str | None:
            # the report is written by a worker thread; on a loaded host it may come a moment after the alert
            text = " ".join(cli("status", "--db", str(db)).stdout.split())  # rich wraps at 80 columns
            return text if "report: " in text else None

        shown = wait_for(status_with_report, "the incident's report in status")
        assert f"alertmanager {alertmanager}/api/v2/alerts: " in shown and " 0 failed, 0 dropped" in shown, shown
        assert shown.count("report: ") == 1, shown  # written when it fired, rewritten when it resolved
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            own = resp.read().decode()
        assert f'vllm_sentinel_alertmanager_notifications_total{{alertmanager="{alertmanager}/api/v2/alerts",result="sent"}}' in own
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        target.close()
    from vllm_sentinel.agent.store.db import Store
    with Store.open(db, read_only=True) as s:
        state = s.con.execute("SELECT state FROM incidents WHERE id = ?", [iid]).fetchone()
    assert state == ("resolved",)


def two_fix_incident() -> Incident:
    inc = incident()
    inc.fixes = [{"param": "--max-num-seqs", "current": "4", "suggested": "1", "why": "..."},
                 {"param": "--num-gpu-blocks-override", "current": "8", "suggested": "16", "why": "..."}]
    return inc


def test_alerts_lead_with_the_fix_the_model_ranks_first_ranked_once_per_incident():
    calls: list[str] = []

    def rank(reader, inc, now_ms):
        calls.append(reader)
        first, second = inc.fixes
        return ([{**second, "rank": 1, "predicted": {"ttft_p95_s": 1.84, "goodput_rps": 6.46, "throughput_tps": 1587.0,
                                                       "preemptions_per_s": 0.0, "trade": None}},
                 {**first, "rank": 2, "predicted": {"ttft_p95_s": 9.1, "goodput_rps": 0.4, "throughput_tps": 700.0,
                                                    "preemptions_per_s": 0.0,
                                                    "trade": "preemptions/s 4.7 → 0 bought with TTFT p95 2.4 → 9.1"}}],
                {"withheld": None, "calibration_error": {"ttft_p95_s": 0.02, "preemptions_per_s": 0.13}})
    rec = Recorder()
    n = am.AlertmanagerNotifier(["http://am:9093"], resend_s=60, post=rec, rank=rank)
    inc = two_fix_incident()
    n.after_evaluation(T0, [inc], [], reader=lambda: "reader@T0")
    n.after_evaluation(T0 + 60_000, [inc], [], reader=lambda: "reader@T1")  # the resend: ranked already
    n.close()
    first, resent = [b[0]["annotations"] for b in rec.batches]
    assert first["fix"] == "--num-gpu-blocks-override 8 -> 16"  # not the rule's first, which shrinks the batch
    assert first["fix_predicted"] == "TTFT p95 1.84 s, goodput 6.46 req/s, tokens/s 1,587, preemptions/s 0"
    assert first["fix_ranking"] == ("ranked 1 of 2 by predicted goodput under the SLO "
                                    "(model error up to 13% on this incident's history)")
    assert "fix_trade" not in first and resent == first
    assert calls == ["reader@T0"]


def test_an_alert_is_never_held_for_the_model():
    rec = Recorder()
    busy = am.AlertmanagerNotifier(["http://am:9093"], post=rec, rank=lambda *a: pytest.fail("ranked while saturated"),
                                   gate=lambda work, retry: False)
    busy.after_evaluation(T0, [two_fix_incident()], [], reader=lambda: None)
    busy.close()
    notes = rec.batches[0][0]["annotations"]
    assert notes["fix"] == "--max-num-seqs 4 -> 1" and notes["fix_ranking"].startswith("not ranked: the host was saturated")

    def broken(reader, inc, now_ms):
        raise RuntimeError("no samples")
    rec = Recorder()
    failing = am.AlertmanagerNotifier(["http://am:9093"], post=rec, rank=broken)
    failing.after_evaluation(T0, [two_fix_incident()], [], reader=lambda: None)
    failing.close()
    notes = rec.batches[0][0]["annotations"]
    assert notes["fix"] == "--max-num-seqs 4 -> 1"
    assert notes["fix_ranking"] == "in the rule's order: the model withheld its predictions (the model failed: no samples)"


def test_the_daemons_ranking_of_a_recorded_kv_incident_matches_diagnose(recorded_db: tuple):
    """rank_for_alert on the recorded real session: the memory lever first, as diagnose and reports rank it."""
    from vllm_sentinel.agent.daemon.alert_fixes import fix_annotations, rank_for_alert
    from vllm_sentinel.agent.diagnosis.diagnose import diagnose
    from vllm_sentinel.agent.diagnosis.fix_ranking import Objectives
    from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
    from vllm_sentinel.agent.alerts.rulepack import load_pack
    from vllm_sentinel.agent.store.db import Store
    from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms

    path, first, last = recorded_db
    with Store.open(path, read_only=True) as store:
        doc = diagnose(store, first - 1, last, evaluate_window=pack_window_evaluator(load_pack()))
        kv = next(i for i in doc["incidents"] if i["incident"] == "kv_cache_pressure")
        inc = Incident(RULE, {"incident": "kv_cache_pressure", "instance": kv["instance"]}, parse_rfc3339_ms(kv["start"]),
                       parse_rfc3339_ms(kv["end"]) if kv.get("end") else None)
        inc.fixes = [{k: v for k, v in f.items() if k not in ("predicted", "rank")} for f in reversed(kv["fixes"])]
        fixes, model = rank_for_alert(store.reader(), inc, last, Objectives())
    assert [f["param"] for f in fixes] == [f["param"] for f in kv["fixes"]]
    notes = fix_annotations(fixes, model)
    assert notes["fix"].startswith("--num-gpu-blocks-override 8 -> ")
    assert notes["fix_ranking"].startswith("ranked 1 of ") and "goodput" in notes["fix_predicted"]
