"""The Prometheus HTTP client against a real local HTTP(S) server speaking the query API's JSON.

The server is a small stand-in for Prometheus' /api/v1 (http.server on loopback, real sockets, real
TLS with a self-signed certificate made by openssl): it checks the points limit as Prometheus does
(web/api/v1/api.go: more than 11,000 points per series is a 400 bad_data) and records what it was
asked, so splitting, auth headers and the concurrency bound are proven on the wire, not on a mock.
The client against the real Prometheus 2.42 is tested in tests/agent/diagnosis/test_remote.py.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sentinel.collectors.prometheus import (MAX_POINTS_PER_SERIES, PrometheusClient, PrometheusConnection,
                                                 PrometheusError, PrometheusQueryError, split_range)
from vllm_sentinel.agent.demo.vllm_server import free_port

T0 = 1_795_946_400_000  # 2026-11-29T10:00:00Z


class FakePrometheus(ThreadingHTTPServer):
    """Answers query_range with one series whose value is its timestamp; behaviour set per test."""

    daemon_threads = True

    def __init__(self, port: int, tls: ssl.SSLContext | None = None):
        super().__init__(("127.0.0.1", port), Handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay_s = 0.0
        self.status = 200
        self.body: bytes | None = None  # a fixed answer instead of the computed one


class Handler(BaseHTTPRequestHandler):
    server: FakePrometheus

    def log_message(self, *args: object) -> None:  # quiet test output
        pass

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        self._answer(path, urllib.parse.parse_qs(query))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        self._answer(self.path, urllib.parse.parse_qs(body))

    def _answer(self, path: str, params: dict[str, list[str]]) -> None:
        srv = self.server
        with srv.lock:
            srv.requests.append((path, params, dict(self.headers)))
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        try:
            time.sleep(srv.delay_s)
            status, doc = self._result(path, params)
            data = srv.body if srv.body is not None else json.dumps(doc).encode()
            self.send_response(srv.status if srv.status != 200 else status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)
        finally:
            with srv.lock:
                srv.in_flight -= 1

    def _result(self, path: str, p: dict[str, list[str]]) -> tuple[int, dict]:
        if path == "/api/v1/query_range":
            start, end, step = float(p["start"][0]), float(p["end"][0]), float(p["step"][0])
            if (end - start) / step > MAX_POINTS_PER_SERIES:
                return 400, {"status": "error", "errorType": "bad_data",
                             "error": "exceeded maximum resolution of 11,000 points per timeseries. "
                                      "Try decreasing the query resolution (?step=XX)"}
            n = int(round((end - start) / step)) + 1
            values = [[start + i * step, str(start + i * step)] for i in range(n) if start + i * step <= end + 1e-9]
            return 200, {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"instance": "a:8000"}, "values": values}]}}
        if path == "/api/v1/query":
            return 200, {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"instance": "a:8000"}, "value": [float(p["time"][0]), "NaN"]}]}}
        if path.startswith("/api/v1/label/"):
            return 200, {"status": "success", "data": ["a:8000", "b:8000"]}
        return 404, {"status": "error", "error": "not found"}


@pytest.fixture
def server():
    srv = FakePrometheus(free_port())
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def client(srv: FakePrometheus, scheme: str = "http", **kw: object) -> PrometheusClient:
    return PrometheusClient(PrometheusConnection(f"{scheme}://127.0.0.1:{srv.server_address[1]}", **kw))  # type: ignore[arg-type]


# -- splitting ------------------------------------------------------------------------------------

@given(start=st.integers(0, 10**7), steps=st.integers(0, 500), step=st.integers(1, 10**5),
       off_grid=st.integers(0, 10**5), limit=st.integers(2, 50))
@settings(max_examples=300, deadline=None)
def test_pieces_cover_the_grid_once_within_the_limit(start: int, steps: int, step: int, off_grid: int,
                                                     limit: int) -> None:
    end = start + steps * step + off_grid % step
    pieces = split_range(start, end, step, max_points=limit)
    times = [t for s, e in pieces for t in range(s, e + 1, step)]
    assert times == list(range(start, end + 1, step))  # the whole grid, no gap, no repeat
    assert all((e - s) // step + 1 <= limit for s, e in pieces)


def test_a_day_at_one_second_is_split_under_the_points_limit_and_joined(server: FakePrometheus) -> None:
    end = T0 + 86_400_000
    [series] = client(server).query_range("up", T0, end, 1000)
    ranges = [(float(p["start"][0]), float(p["end"][0])) for path, p, _ in server.requests if path.endswith("range")]
    assert len(ranges) == 8  # 86,401 points / 11,000
    assert all((e - s) / 1.0 <= MAX_POINTS_PER_SERIES for s, e in ranges)  # none refused by the server
    assert [t for t, _ in series.points] == list(range(T0, end + 1, 1000))
    assert series.points[-1] == (end, end / 1000)


def test_an_unsplit_query_over_the_limit_is_what_the_server_refuses(server: FakePrometheus) -> None:
    # the stand-in refuses like Prometheus: proves the split above is what keeps queries under it
    c = client(server)
    with pytest.raises(PrometheusQueryError, match="11,000 points"):
        c._range_piece("up", T0, T0 + 11_001_000, 1000)


def test_many_queries_run_concurrently_within_the_bound(server: FakePrometheus) -> None:
    server.delay_s = 0.2
    c = client(server, max_concurrency=3)
    out = c.query_ranges([(f"q{i}", T0, T0 + 60_000, 15_000) for i in range(10)])
    assert len(out) == 10 and all(len(r[0].points) == 5 for r in out)
    assert 2 <= server.max_in_flight <= 3


def test_concurrency_one_is_one_request_at_a_time(server: FakePrometheus) -> None:
    server.delay_s = 0.05
    client(server, max_concurrency=1).queries([("up", T0 + i) for i in range(5)])
    assert server.max_in_flight == 1


def test_instant_values_and_label_values(server: FakePrometheus) -> None:
    c = client(server)
    [s] = c.query("up", T0 + 1500)
    assert s.labels == {"instance": "a:8000"} and s.value != s.value  # 'NaN' is a float NaN
    path, params, _ = server.requests[-1]
    assert path == "/api/v1/query" and params["time"] == ["1795946401.500"]
    assert c.label_values("instance", ['{__name__=~"vllm:.+"}', "up"], T0, T0 + 1000) == ["a:8000", "b:8000"]
    path, params, _ = server.requests[-1]
    assert params["match[]"] == ['{__name__=~"vllm:.+"}', "up"]


# -- errors ------------------------------------------------------------------------------------------

def test_unreachable_server_is_one_line() -> None:
    port = free_port()
    with pytest.raises(PrometheusError) as e:
        PrometheusClient(PrometheusConnection(f"http://127.0.0.1:{port}")).query("up", T0)
    assert str(e.value) == (f"cannot reach Prometheus at http://127.0.0.1:{port}: connection refused; "
                            "is it running, is --prometheus right?")


def test_4xx_quotes_prometheus_error_field(server: FakePrometheus) -> None:
    server.status = 400
    server.body = json.dumps({"status": "error", "errorType": "bad_data",
                              "error": "1:5: parse error: unexpected \"}\""}).encode()
    with pytest.raises(PrometheusQueryError) as e:
        client(server).query("up}", T0)
    msg = str(e.value)
    assert "answered HTTP 400 (bad_data)" in msg and 'parse error: unexpected "}"' in msg and "\n" not in msg


def test_5xx_is_a_server_failure_not_a_query_error(server: FakePrometheus) -> None:
    server.status = 503
    server.body = json.dumps({"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}).encode()
    with pytest.raises(PrometheusError) as e:
        client(server).query("up", T0)
    assert not isinstance(e.value, PrometheusQueryError)
    assert "HTTP 503 (unavailable)" in str(e.value) and "TSDB not ready" in str(e.value)


def test_401_names_the_auth_flags(server: FakePrometheus) -> None:
    server.status, server.body = 401, b"Unauthorized\n"
    with pytest.raises(PrometheusError, match="check --bearer-token-file or --basic-auth-user"):
        client(server).query("up", T0)


def test_a_page_that_is_not_the_api(server: FakePrometheus) -> None:
    server.body = b"<html>Grafana</html>"
    with pytest.raises(PrometheusError, match="did not answer with Prometheus' API .not JSON"):
        client(server).query("up", T0)


def test_timeout_is_one_line_naming_the_fix(server: FakePrometheus) -> None:
    server.delay_s = 3
    with pytest.raises(PrometheusError) as e:
        client(server, timeout_s=0.5).query("up", T0)
    assert "did not answer within 0.5 s" in str(e.value) and "--prometheus-timeout" in str(e.value)


def test_a_bad_url_is_refused_before_any_request() -> None:
    with pytest.raises(PrometheusError, match="give the server's base URL"):
        PrometheusClient(PrometheusConnection("prometheus:9090"))


# -- auth ---------------------------------------------------------------------------------------------

def test_bearer_token_from_file_reaches_the_server(server: FakePrometheus, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t\n")
    client(server, bearer_token_file=str(token)).query("up", T0)
    assert server.requests[-1][2]["Authorization"] == "Bearer s3cr3t"


def test_basic_auth_from_user_and_password_file(server: FakePrometheus, tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("hunter2")
    client(server, basic_auth_user="ops", basic_auth_password_file=str(pw)).query("up", T0)
    assert server.requests[-1][2]["Authorization"] == "Basic b3BzOmh1bnRlcjI="  # base64("ops:hunter2")


@pytest.mark.parametrize("kw,message", [
    ({"bearer_token_file": "/nonexistent/token"}, "--bearer-token-file /nonexistent/token: cannot read it"),
    ({"basic_auth_password_file": "/x"}, "--basic-auth-password-file needs --basic-auth-user"),
    ({"bearer_token_file": "/x", "basic_auth_user": "u"}, "two ways to authenticate"),
    ({"basic_auth_user": "a:b"}, "cannot hold ':'"),
    ({"ca_file": "/x"}, "apply to https URLs"),
])
def test_bad_auth_options_fail_before_any_request(server: FakePrometheus, kw: dict, message: str) -> None:
    with pytest.raises(PrometheusError, match=message):
        client(server, **kw)
    assert server.requests == []


def test_a_secret_file_of_several_lines_is_refused(server: FakePrometheus, tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("one\ntwo\n")
    with pytest.raises(PrometheusError, match="expected one line holding the secret, found several lines"):
        client(server, bearer_token_file=str(f))


# -- TLS -------------------------------------------------------------------------------------------------

def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by openssl (EC: quick on a busy host)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_server(certificate: tuple[Path, Path]):
    cert, key = certificate
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = FakePrometheus(free_port(), tls=ctx)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv, cert
    finally:
        srv.shutdown()
        srv.server_close()


def test_tls_with_an_untrusted_certificate_names_ca_file(tls_server) -> None:
    srv, _cert = tls_server
    with pytest.raises(PrometheusError, match="TLS verification of https://127.0.0.1:.* failed .*--ca-file"):
        client(srv, "https").query("up", T0)


def test_tls_with_ca_file_or_without_verification(tls_server) -> None:
    srv, cert = tls_server
    assert client(srv, "https", ca_file=str(cert)).query("up", T0)[0].labels == {"instance": "a:8000"}
    assert client(srv, "https", insecure_skip_verify=True).query("up", T0)[0].labels == {"instance": "a:8000"}


def test_a_ca_file_that_is_not_pem(tls_server, tmp_path: Path) -> None:
    srv, _cert = tls_server
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(PrometheusError, match="cannot load it as PEM certificates"):
        client(srv, "https", ca_file=str(bad))
