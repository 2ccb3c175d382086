"""collectors/vllm.py against a real HTTP server on 127.0.0.1 that serves real vLLM captures."""

from __future__ import annotations

import math
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vllm_sentinel.agent.demo.vllm_server import free_port
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.collectors.exposition import parse
from vllm_sentinel.collectors.vllm import (
    Response, VllmCollector, default_instance, http_fetch, normalize_target,
)

FIXTURES = Path(__file__).parent / "fixtures"
ONE_REQUEST = (FIXTURES / "vllm-0.32.0-cpu-one-request.prom.txt").read_bytes()
PREEMPTIONS = (FIXTURES / "vllm-0.32.0-cpu-after-preemptions.prom.txt").read_bytes()
OPENMETRICS = (FIXTURES / "vllm-0.32.0-dp1-rendered.openmetrics.txt").read_bytes()
TEXT_CT = "text/plain; version=0.0.4; charset=utf-8"
META = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


@dataclass
class Behaviour:
    """What the fake-free test server does next; the test changes it between scrapes."""

    body: bytes = ONE_REQUEST
    status: int = 200
    content_type: str = TEXT_CT
    delay_s: float = 0.0          # before the headers
    drip_s: float = 0.0           # between body chunks (a slow body)
    content_length: bool = True
    requests: list[dict[str, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


class _Handler(BaseHTTPRequestHandler):
    behaviour: Behaviour

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        b = self.server.behaviour  # type: ignore[attr-defined]
        b.requests.append({"path": self.path, **dict(self.headers)})
        if b.delay_s and b.stop.wait(b.delay_s):
            return
        self.send_response(b.status)
        self.send_header("Content-Type", b.content_type)
        if b.content_length:
            self.send_header("Content-Length", str(len(b.body)))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        try:
            if b.drip_s:
                for i in range(0, len(b.body), 4096):
                    self.wfile.write(b.body[i:i + 4096])
                    self.wfile.flush()
                    if b.stop.wait(b.drip_s):
                        return
            else:
                self.wfile.write(b.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the collector stopped reading, as it should past a limit

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, Behaviour]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.behaviour = Behaviour()  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd.behaviour  # type: ignore[attr-defined]
    finally:
        httpd.behaviour.stop.set()  # type: ignore[attr-defined]
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def meta(batch: Batch) -> dict[str, float | None]:
    return {m: v for m, lab, v in zip(batch.metrics, batch.labels, batch.values) if m in META and lab == ""}


def samples(batch: Batch) -> dict[tuple[str, str], float | None]:
    return {(m, lab): v for m, lab, v in zip(batch.metrics, batch.labels, batch.values) if m not in META}


# --- a healthy vLLM -----------------------------------------------------------------------

def test_scrapes_real_capture_like_prometheus(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    collector = VllmCollector(url)
    batch = collector.collect(1_000)
    assert batch.status is not None and batch.status.ok, batch.status
    expected = parse(ONE_REQUEST.decode())
    assert meta(batch)["up"] == 1.0
    assert meta(batch)["scrape_samples_scraped"] == len(expected) == 381
    assert meta(batch)["scrape_duration_seconds"] > 0
    got = samples(batch)
    assert len(got) == len(expected)
    assert got[("vllm:num_preemptions_total", 'engine="0",model_name="tiny-llama"')] is not None
    assert not any(m.endswith("_created") for m in batch.metrics)
    assert batch.instance == url.removeprefix("http://") and batch.ts_ms == 1_000
    assert len(batch.metrics) == len(batch.labels) == len(batch.values) == len(batch.timestamps_ms)
    # asked for /metrics in plain text first
    request = behaviour.requests[0]
    assert request["path"] == "/metrics"
    assert request["Accept"].startswith("text/plain;version=0.0.4")


def test_counters_match_the_capture(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.body = PREEMPTIONS
    got = samples(VllmCollector(url).collect(1_000))
    ref = parse(PREEMPTIONS.decode())
    for name, labels, value in zip(ref.names, ref.labels, ref.values):
        v = got[(name, labels)]
        assert v == value or (math.isnan(v) and math.isnan(value))


def test_openmetrics_answer_gets_canonical_names(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.body = OPENMETRICS
    behaviour.content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
    batch = VllmCollector(url).collect(1_000)
    assert batch.status.ok and meta(batch)["up"] == 1.0
    assert "vllm:num_requests_running" in batch.metrics
    assert not any(m.startswith("vllm_") for m in batch.metrics)
    assert batch.sources["vllm:num_requests_running"] == "vllm_num_requests_running"


def test_old_names_are_aliased_and_sources_kept(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.body = (b'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
                      b'vllm:num_requests_running{engine="0",model_name="m"} 2\n')
    batch = VllmCollector(url).collect(1_000)
    assert samples(batch)[("vllm:kv_cache_usage_perc", 'engine="0",model_name="m"')] == 0.25
    assert batch.sources == {"vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc"}


# --- failures: up 0 with a status that names the cause and the fix ------------------------

def test_dead_port() -> None:
    collector = VllmCollector(f"127.0.0.1:{free_port()}", timeout_s=2)
    batch = collector.collect(1_000)
    assert meta(batch) == {"up": 0.0, "scrape_duration_seconds": pytest.approx(meta(batch)["scrape_duration_seconds"]),
                           "scrape_samples_scraped": 0.0}
    assert not batch.status.ok
    assert "connection refused" in batch.status.error and "is vLLM running" in batch.status.error


@pytest.mark.parametrize(("slowness", "seconds", "timeout_s"), [
    ("delay_s", 5.0, 0.2),  # no headers before the timeout
    ("drip_s", 0.1, 0.3),  # headers at once, then 4 KiB every 0.1 s: each read is quick, the whole answer is not
], ids=["slow_server_beyond_timeout", "slow_body_is_bounded_by_one_deadline"])
def test_slow_answer_is_bounded_by_the_scrape_timeout(server: tuple[str, Behaviour], slowness: str, seconds: float,
                                                      timeout_s: float) -> None:
    url, behaviour = server
    setattr(behaviour, slowness, seconds)
    batch = VllmCollector(url, timeout_s=timeout_s).collect(1_000)
    assert meta(batch)["up"] == 0.0
    assert "--scrape-timeout" in batch.status.error


def test_garbage_output(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.body = b"<html>\n<body>Welcome to nginx!</body>\n</html>\n"
    behaviour.content_type = "text/html"
    batch = VllmCollector(url).collect(1_000)
    assert meta(batch)["up"] == 0.0 and len(batch) == 3
    assert "malformed line 1" in batch.status.error and "<html>" in batch.status.error


def test_prometheus_endpoint_that_is_not_vllm(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.body = b"# TYPE node_load1 gauge\nnode_load1 0.5\n"
    batch = VllmCollector(url).collect(1_000)
    assert meta(batch)["up"] == 0.0 and len(batch) == 3
    assert "no vllm: metrics" in batch.status.error and "--disable-log-stats" in batch.status.error


@pytest.mark.parametrize("content_length", [True, False])
def test_oversized_body(server: tuple[str, Behaviour], content_length: bool) -> None:
    url, behaviour = server
    behaviour.content_length = content_length
    batch = VllmCollector(url, max_bytes=10_000).collect(1_000)
    assert meta(batch)["up"] == 0.0
    assert "larger than the limit of 10000 bytes" in batch.status.error


def test_http_error_status(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.status = 404
    behaviour.body = b"Not Found"
    batch = VllmCollector(url).collect(1_000)
    assert meta(batch)["up"] == 0.0 and "HTTP 404" in batch.status.error


def test_malformed_line_keeps_the_good_ones(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.body = ONE_REQUEST + b'thirdparty_metric{a="unterminated 1\n'
    batch = VllmCollector(url).collect(1_000)
    assert meta(batch)["up"] == 1.0 and meta(batch)["scrape_samples_scraped"] == 381
    assert not batch.status.ok
    line_no = ONE_REQUEST.count(b"\n") + 1
    assert f"line {line_no}" in batch.status.error and batch.status.detail["malformed_lines"] == 1


def test_injected_fetch_that_raises_never_escapes() -> None:
    def broken(url: str, timeout_s: float, max_bytes: int) -> Response:
        raise RuntimeError("boom")

    batch = VllmCollector("http://vllm.invalid:8000", fetch=broken).collect(1_000)
    assert meta(batch)["up"] == 0.0 and "RuntimeError: boom" in batch.status.error


# --- staleness and recovery ---------------------------------------------------------------

def test_recovery_after_outage_with_staleness_markers(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    collector = VllmCollector(url, timeout_s=2)
    first = collector.collect(1_000)
    live = samples(first)
    behaviour.status, behaviour.body = 503, b"Service Unavailable"
    down = collector.collect(2_000)
    assert meta(down)["up"] == 0.0 and "HTTP 503" in down.status.error
    stale = samples(down)
    assert set(stale) == set(live) and all(v is None for v in stale.values())  # one marker each
    again = collector.collect(3_000)  # still down: no second marker
    assert samples(again) == {}
    behaviour.status, behaviour.body = 200, ONE_REQUEST
    back = collector.collect(4_000)
    assert meta(back)["up"] == 1.0 and back.status.ok
    assert samples(back) == live


def test_series_that_disappear_get_one_stale_marker(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    collector = VllmCollector(url)
    collector.collect(1_000)
    lines = ONE_REQUEST.decode().splitlines(keepends=True)
    gone = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"}'
    behaviour.body = "".join(line for line in lines if not line.startswith(gone)).encode()
    second = collector.collect(2_000)
    stale = [(m, lab) for m, lab, v in zip(second.metrics, second.labels, second.values) if v is None]
    assert stale == [("vllm:kv_cache_usage_perc", 'engine="0",model_name="tiny-llama"')]
    third = collector.collect(3_000)
    assert None not in third.values


def test_bodies_of_the_same_shape_give_what_a_fresh_collector_gives(server: tuple[str, Behaviour]) -> None:
    """The collector reads a body shaped as the last one by its values alone; every scrape must still be
    exactly what a collector seeing that body for the first time returns, stale markers aside."""
    url, behaviour = server
    collector = VllmCollector(url, labels={"zone": "a"})
    lines = ONE_REQUEST.decode().splitlines(keepends=True)
    gone = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"}'
    bumped = "".join(re.sub(r" (\d+)\.0$", lambda m: f" {int(m.group(1)) + 3}.0", line) for line in lines)
    without = "".join(line for line in bumped.splitlines(keepends=True) if not line.startswith(gone))
    bodies = [ONE_REQUEST.decode(), bumped, bumped, without, without, bumped, ONE_REQUEST.decode()]
    for i, body in enumerate(bodies):
        behaviour.body = body.encode()
        got = collector.collect(1_000 * (i + 1))
        fresh = VllmCollector(url, labels={"zone": "a"}).collect(1_000 * (i + 1))
        kept = [(m, lab, v) for m, lab, v in zip(got.metrics, got.labels, got.values) if m not in META]
        want = [(m, lab, v) for m, lab, v in zip(fresh.metrics, fresh.labels, fresh.values) if m not in META]
        markers = [(m, lab, v) for m, lab, v in kept if v is None]
        assert [k for k in kept if k[2] is not None] == want, i
        assert got.sources == fresh.sources and set(got.timestamps_ms) == set(fresh.timestamps_ms) == {None}
        # one marker when the series goes (scrape 3), none while it stays gone or is back
        assert markers == ([("vllm:kv_cache_usage_perc", 'engine="0",model_name="tiny-llama",zone="a"', None)]
                           if i == 3 else []), i


# --- configuration ------------------------------------------------------------------------

@pytest.mark.parametrize("target, url, instance", [
    ("127.0.0.1:8000", "http://127.0.0.1:8000/metrics", "127.0.0.1:8000"),
    ("http://vllm-0:8000/", "http://vllm-0:8000/metrics", "vllm-0:8000"),
    ("http://h/custom/metrics", "http://h/custom/metrics", "h:80"),
    ("https://h", "https://h/metrics", "h:443"),
    ("http://[::1]:9000", "http://[::1]:9000/metrics", "[::1]:9000"),
])
def test_target_forms(target: str, url: str, instance: str) -> None:
    assert normalize_target(target) == url
    assert default_instance(url) == instance
    assert VllmCollector(target).instance == instance
    assert VllmCollector(target, instance="pod-a").instance == "pod-a"


@pytest.mark.parametrize("target", ["ftp://h:1", "http://:8000", "http://h:port"])
def test_bad_targets_fail_at_start(target: str) -> None:
    with pytest.raises(ValueError, match="target"):
        VllmCollector(target)


def test_http_fetch_returns_status_type_and_body(server: tuple[str, Behaviour]) -> None:
    url, _ = server
    response = http_fetch(url + "/metrics", 2.0, 1 << 20)
    assert response.status == 200 and response.content_type == TEXT_CT and response.body == ONE_REQUEST


def test_batches_land_in_the_store_with_source_names(server: tuple[str, Behaviour]) -> None:
    from vllm_sentinel.agent.store.db import Store

    url, behaviour = server
    behaviour.body = (b'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
                      b'vllm:num_requests_running{engine="0",model_name="m"} 2\n')
    collector = VllmCollector(url)
    store = Store.open(":memory:")
    try:
        store.append(collector.collect(1_000_000))
        behaviour.body = b'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        store.append(collector.collect(1_001_000))
        cur = store.cursor()
        rows = cur.execute("SELECT metric, source_metric FROM series WHERE metric LIKE 'vllm:%' "
                           "ORDER BY metric").fetchall()
        assert rows == [("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                        ("vllm:num_requests_running", "vllm:num_requests_running")]
        kv = cur.execute("SELECT s.ts, s.value FROM samples s JOIN series USING (series_id) "
                         "WHERE metric = 'vllm:kv_cache_usage_perc' ORDER BY ts").fetchall()
        assert kv == [(1_000_000, 0.25), (1_001_000, None)]  # the stale marker is a NULL
    finally:
        store.close()


# --- a body cut off in transit ------------------------------------------------------------

def _cut_at_line_end(body: bytes, fraction: float) -> bytes:
    return body[: body.rindex(b"\n", 0, int(len(body) * fraction)) + 1]


class RawServer:
    """A listening socket on 127.0.0.1 that answers each connection with the next raw byte string,
    written as is, then closes: a server that lies about its Content-Length or drops a chunked body."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for answer in self.answers:
            conn, _ = self.sock.accept()
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)


def _plain(body: bytes, declared: int) -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: {TEXT_CT}\r\nContent-Length: {declared}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def _chunked(body: bytes, complete: bool) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {TEXT_CT}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 4096]), body[i:i + 4096])
                      for i in range(0, len(body), 4096))
    return head + chunks + (b"0\r\n\r\n" if complete else b"")


@pytest.mark.parametrize("cut", ["short-content-length", "chunked-without-last-chunk"])
def test_a_body_cut_off_is_a_failed_scrape_not_a_good_one(cut: str) -> None:
    partial = _cut_at_line_end(ONE_REQUEST, 0.4)
    bad = (_plain(partial, declared=len(ONE_REQUEST)) if cut == "short-content-length"
           else _chunked(partial, complete=False))
    server = RawServer([_plain(ONE_REQUEST, len(ONE_REQUEST)), bad, _chunked(ONE_REQUEST, complete=True)])
    try:
        collector = VllmCollector(server.url, timeout_s=5)
        good = collector.collect(1_000)
        assert meta(good)["up"] == 1.0 and meta(good)["scrape_samples_scraped"] == 381
        cut_off = collector.collect(2_000)
        # As any failed scrape: up 0, nothing of the partial body kept, every series stale at once.
        assert meta(cut_off)["up"] == 0.0 and meta(cut_off)["scrape_samples_scraped"] == 0.0
        assert not cut_off.status.ok and "cut off" in cut_off.status.error
        assert "proxy" in cut_off.status.error and "\n" not in cut_off.status.error
        stale = samples(cut_off)
        assert set(stale) == set(samples(good)) and all(v is None for v in stale.values())
        back = collector.collect(3_000)  # a complete chunked body is a good scrape again
        assert meta(back)["up"] == 1.0 and back.status.ok and samples(back) == samples(good)
    finally:
        server.close()


def test_a_first_scrape_cut_off_stores_no_samples() -> None:
    partial = _cut_at_line_end(ONE_REQUEST, 0.4)
    server = RawServer([_plain(partial, declared=len(ONE_REQUEST))])
    try:
        batch = VllmCollector(server.url, timeout_s=5).collect(1_000)
    finally:
        server.close()
    assert parse(partial.decode()).names  # the cut-off part alone would parse as samples
    assert samples(batch) == {} and meta(batch)["up"] == 0.0
    assert f"{len(partial)} of {len(ONE_REQUEST)} bytes" in batch.status.error


def test_openmetrics_without_final_eof_is_a_failed_scrape(server: tuple[str, Behaviour]) -> None:
    url, behaviour = server
    behaviour.content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    behaviour.content_length = False  # nothing but '# EOF' can tell the body is whole
    behaviour.body = _cut_at_line_end(OPENMETRICS, 0.5)
    batch = VllmCollector(url).collect(1_000)
    assert meta(batch)["up"] == 0.0 and samples(batch) == {}
    assert "# EOF" in batch.status.error
    behaviour.body = OPENMETRICS
    assert meta(VllmCollector(url).collect(2_000))["up"] == 1.0
