"""vllm_sentinel_desired_replicas on the daemon's own /metrics: the gauge from the evaluator's output, and the
real `vllm-sentinel run` process watching a loopback target that serves a real vLLM capture."""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import generate_latest

from tests.agent.daemon.test_fault_targets import free_port, metric_value
from tests.agent.daemon.test_sidecar import start_daemon
from vllm_sentinel.agent.daemon.selfmetrics import SelfMetrics
from vllm_sentinel.agent.diagnosis.replica_signal import ReplicaNeed

CAPTURE = Path(__file__).parents[2] / "collectors" / "fixtures" / "vllm-0.32.0-cpu-after-preemptions.prom.txt"
GAUGE = "vllm_sentinel_desired_replicas"
COUNTER = re.compile(r"^(vllm:\S+?(_total|_count|_sum|_bucket))(\{[^}]*\})? (\S+)$")


def series(registry, name: str) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    out = {}
    for line in text.splitlines():
        m = re.match(rf'^{name}\{{model_name="([^"]*)",reason="([^"]*)"\}} (\S+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def test_the_gauge_has_one_series_per_model_and_drops_a_reason_that_no_longer_holds() -> None:
    m = SelfMetrics()
    m.set_desired_replicas({"a": ReplicaNeed("a", 5, "queue", "x"), "b": ReplicaNeed("b", 2, "none")})
    assert series(m.registry, GAUGE) == {("a", "queue"): 5.0, ("b", "none"): 2.0}
    m.set_desired_replicas({"a": ReplicaNeed("a", 3, "none")})  # the queue drained; b's target went away
    assert series(m.registry, GAUGE) == {("a", "none"): 3.0}


class GrowingTarget:
    """Serves the capture taken after forced preemptions; once `grow` is set, every scrape adds 5 % of
    the captured value to each vLLM counter and histogram, so rates read as the capture's traffic repeating."""

    def __init__(self) -> None:
        self.lines = CAPTURE.read_text().splitlines()
        self.grow, self.scrapes = False, 0
        target = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = target.body().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def body(self) -> str:
        if self.grow:
            self.scrapes += 1
        factor = 1 + 0.05 * self.scrapes
        out = []
        for line in self.lines:
            m = COUNTER.match(line)
            out.append(f"{m.group(1)}{m.group(3) or ''} {float(m.group(4)) * factor!r}" if m else line)
        return "\n".join(out) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def wait_for(port: int, predicate, timeout: float = 60) -> str:
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        text = scrape(port)
        if predicate(text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"never matched; last {GAUGE} lines: {[x for x in text.splitlines() if GAUGE in x]}")


def expected_kv_replicas() -> int:
    """The replica arithmetic on the capture's own numbers: 1 replica now, nothing running or waiting."""
    text = CAPTURE.read_text()

    def value(name: str) -> float:
        return float(re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))
    info = dict(re.findall(r'(\w+)="([^"]*)"', re.search(r"^vllm:cache_config_info\{(.*)\}", text, re.M).group(1)))
    per_request = (value("vllm:request_prompt_tokens_sum") / value("vllm:request_prompt_tokens_count")
                   + value("vllm:request_generation_tokens_sum") / value("vllm:request_generation_tokens_count"))
    block = int(info["block_size"])
    # sequences one replica holds: the KV cache with 10 % headroom over a mean request plus half a last block
    per_replica = max(1, int(0.9 * int(info["num_gpu_blocks"]) * block // (per_request + block / 2)))
    demand = value("vllm:num_requests_running") + value("vllm:num_requests_waiting")
    return max(1 + 1, math.ceil(demand / per_replica))  # at least one more than the one serving


def test_the_daemon_exports_the_replicas_its_kv_pressure_asks_for(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("kv_for: 2s\nslo_for: 10m\n")  # kv_cache_pressure fires within seconds; TTFT stays out
    target, port = GrowingTarget(), free_port()
    proc = start_daemon(tmp_path / "s.duckdb", target.url,
                        extra=("--metrics-port", str(port), "--eval-interval", "1s", "--params", str(params),
                               "--nvml", "off"))
    try:
        # counters still: nothing fires, and the signal holds the one replica that serves tiny-llama
        text = wait_for(port, lambda t: metric_value(t, GAUGE, model_name="tiny-llama") is not None)
        assert metric_value(text, GAUGE, model_name="tiny-llama", reason="none") == 1.0
        target.grow = True
        text = wait_for(port, lambda t: metric_value(t, GAUGE, model_name="tiny-llama", reason="kv_pressure")
                        is not None)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        target.close()
    assert metric_value(text, "vllm_sentinel_incidents_active", incident="kv_cache_pressure") == 1.0
    assert metric_value(text, GAUGE, model_name="tiny-llama", reason="kv_pressure") == expected_kv_replicas()
    assert metric_value(text, GAUGE, model_name="tiny-llama", reason="none") is None  # one series per model
