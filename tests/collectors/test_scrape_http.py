"""A target's scrapes share one HTTP/1.1 connection, and a connection the server closed never fails a scrape.

The server here is a real HTTP/1.1 server on 127.0.0.1 that keeps connections alive (as uvicorn under
vLLM does), serving a real vLLM capture; it counts the connections it accepted. Every case runs against
both fetches: the blocking one (`scrape_http.KeptConnection`, a thread per scrape) and the one the
daemon runs on its asyncio loop (`scrape_async.AsyncKeptConnection`).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vllm_sentinel.collectors import scrape_async, scrape_http
from vllm_sentinel.collectors.scrape_async import AsyncKeptConnection
from vllm_sentinel.collectors.scrape_http import KeptConnection, ResponseTooLarge
from vllm_sentinel.collectors.vllm import VllmCollector

BODY = (Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-one-request.prom.txt").read_bytes()


@dataclass
class Server:
    """What the keep-alive server does with the requests of each connection."""

    url: str = ""
    connections: int = 0
    requests: int = 0
    answers_per_connection: int = 0  # then it reads the next request and hangs up without an answer (0: no limit)
    close_idle: bool = False  # close each connection right after its answer, without saying so
    big: bool = False  # answer with twice BODY
    closed: threading.Event = field(default_factory=threading.Event)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

    def setup(self) -> None:
        super().setup()
        self.server.state.connections += 1  # type: ignore[attr-defined]
        self.answered = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        state: Server = self.server.state  # type: ignore[attr-defined]
        state.requests += 1
        if state.answers_per_connection and self.answered >= state.answers_per_connection:
            self.close_connection = True  # the request was read; the connection closes with no answer
            return
        body = BODY * 2 if state.big else BODY
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass
        self.answered += 1
        if state.close_idle:
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


class _Closing(ThreadingHTTPServer):
    daemon_threads = True

    def shutdown_request(self, request) -> None:  # noqa: ANN001 - socketserver's signature
        super().shutdown_request(request)
        self.state.closed.set()  # type: ignore[attr-defined]  # after the socket is closed


@pytest.fixture
def server() -> Iterator[Server]:
    httpd = _Closing(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.state = Server(url=f"http://127.0.0.1:{httpd.server_address[1]}/metrics")  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd.state  # type: ignore[attr-defined]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


class Impl:
    """One of the two fetches, driven the same way: a call per scrape that returns or raises."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loop: asyncio.AbstractEventLoop | None = None
        if kind == "loop":
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def fetch(self):
        """A kept-connection fetch, called as fetch(url, timeout_s, max_bytes)."""
        if self.loop is None:
            return KeptConnection()
        kept, loop = AsyncKeptConnection(), self.loop

        class OnLoop:
            def __call__(self, url: str, timeout_s: float, max_bytes: int):
                return asyncio.run_coroutine_threadsafe(kept(url, timeout_s, max_bytes), loop).result(30)

            def close(self) -> None:
                kept.close()
        return OnLoop()

    def collect(self, collector: VllmCollector, now: int):
        """One collect() of a collector built with the default fetch, the way the daemon runs it."""
        if self.loop is None:
            return collector.collect(now)
        return asyncio.run_coroutine_threadsafe(collector.collect_async(now), self.loop).result(30)

    def count_sends(self, monkeypatch) -> list:
        """A list that grows by one at every request written to a connection."""
        sent: list = []
        if self.loop is None:
            send = scrape_http._send
            monkeypatch.setattr(scrape_http, "_send", lambda *a: sent.append(1) or send(*a))
        else:
            ask = scrape_async._Answer.ask
            monkeypatch.setattr(scrape_async._Answer, "ask", lambda *a: sent.append(1) or ask(*a))
        return sent

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(params=["thread", "loop"])
def impl(request) -> Iterator[Impl]:
    it = Impl(request.param)
    yield it
    it.stop()


def _up(batch) -> float:
    return next(v for m, lab, v in zip(batch.metrics, batch.labels, batch.values) if m == "up")


def test_scrapes_of_a_target_share_one_connection(server: Server, impl: Impl) -> None:
    collector = VllmCollector(server.url, timeout_s=5)
    assert [_up(impl.collect(collector, 1000 * i)) for i in range(5)] == [1.0] * 5
    assert (server.connections, server.requests) == (1, 5)
    collector.close()
    assert server.closed.wait(5)  # the kept connection is closed, the server sees its end


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_request(server: Server, impl: Impl,
                                                                                 monkeypatch) -> None:
    sent = impl.count_sends(monkeypatch)
    server.close_idle = True  # as uvicorn past its keep-alive timeout
    collector = VllmCollector(server.url, timeout_s=5)
    for i in range(3):
        assert _up(impl.collect(collector, 1000 * i)) == 1.0
        server.closed.wait(5)
        server.closed.clear()
    assert (server.connections, server.requests, len(sent)) == (3, 3, 3)  # none sent on a closed connection


def test_a_request_the_server_hung_up_on_is_sent_once_more_on_a_new_connection(server: Server, impl: Impl) -> None:
    server.answers_per_connection = 1  # the close races the next request: that request gets no answer
    collector = VllmCollector(server.url, timeout_s=5)
    assert [_up(impl.collect(collector, 1000 * i)) for i in range(3)] == [1.0] * 3
    assert (server.connections, server.requests) == (3, 5)  # scrapes 2 and 3: a lost request, then a good one


def test_a_fresh_connection_that_gets_no_answer_is_a_failed_scrape_not_a_retry(server: Server, impl: Impl) -> None:
    server.answers_per_connection = -1  # every connection: the request is read, then the connection closes
    fetch = impl.fetch()
    with pytest.raises((ConnectionError, OSError)):
        fetch(server.url, 5, 1 << 20)
    assert (server.connections, server.requests) == (1, 1)


def test_a_scrape_that_fails_midway_leaves_no_connection_behind(server: Server, impl: Impl) -> None:
    fetch = impl.fetch()
    fetch(server.url, 5, 1 << 20)
    server.big = True
    with pytest.raises(ResponseTooLarge):
        fetch(server.url, 5, len(BODY) + 10)  # the body was not read to its end: the connection is unusable
    assert server.closed.wait(5)
    server.big = False
    assert fetch(server.url, 5, 1 << 20).body == BODY
    assert server.connections == 2


def test_a_server_that_speaks_http_1_0_gets_a_connection_per_scrape(impl: Impl) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []

    def serve() -> None:
        for _ in range(2):
            conn, _addr = listener.accept()
            accepted.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    fetch = impl.fetch()
    try:
        assert [fetch(f"http://127.0.0.1:{port}/metrics", 5, 1 << 20).body for _ in range(2)] == [BODY, BODY]
        thread.join(5)
        assert len(accepted) == 2
    finally:
        fetch.close()
        listener.close()
