"""The daemon's loop fetch reads every answer a /metrics can give as the blocking fetch does.

A raw loopback server answers each connection with scripted bytes (a body split at odd places,
chunked with extensions and a trailer, cut off, oversize, garbage, silence); the same scrape through
`VllmCollector.collect` (http.client, a thread) and `collect_async` (the asyncio loop) must store the
same samples and give the same status line, word for word.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_sentinel.collectors.vllm import VllmCollector

BODY = (Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-one-request.prom.txt").read_bytes()
TYPE = b"Content-Type: text/plain; version=0.0.4\r\n"


def _chunked(body: bytes, size: int) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += b"%x;ext=1\r\n" % len(part) + part + b"\r\n"
    return out + b"0\r\nX-Trailer: yes\r\n\r\n"


# name -> (what the server writes per connection, as pieces sent 5 ms apart; then whether it closes)
ANSWERS: dict[str, tuple[list[bytes], bool]] = {
    "length": ([b"HTTP/1.1 200 OK\r\n" + TYPE + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY], False),
    "length, headers and body in odd pieces": (
        [b"HTTP/1.1 200 OK\r", b"\n" + TYPE[:7], TYPE[7:] + b"Content-Length: %d\r\n\r" % len(BODY), b"\n" + BODY[:3],
         BODY[3:40000], BODY[40000:]], False),
    "chunked": ([b"HTTP/1.1 200 OK\r\n" + TYPE + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(BODY, 7000)], False),
    "chunked in odd pieces": (
        [(b"HTTP/1.1 200 OK\r\n" + TYPE + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(BODY, 4096))[i:i + 1000]
         for i in range(0, len(BODY) + 2000, 1000)], False),
    "chunked, cut off": ([b"HTTP/1.1 200 OK\r\n" + TYPE + b"Transfer-Encoding: chunked\r\n\r\n"
                          + _chunked(BODY, 7000)[:30000]], True),
    "length, cut off": ([b"HTTP/1.1 200 OK\r\n" + TYPE + b"Content-Length: %d\r\n\r\n" % len(BODY)
                         + BODY[:20000]], True),
    "to the close, HTTP/1.0": ([b"HTTP/1.0 200 OK\r\n" + TYPE + b"\r\n" + BODY], True),
    "oversize, no length": ([b"HTTP/1.1 200 OK\r\n" + TYPE + b"Connection: close\r\n\r\n" + BODY * 3], True),
    "oversize by its length": ([b"HTTP/1.1 200 OK\r\n" + TYPE + b"Content-Length: %d\r\n\r\n" % (3 * len(BODY))
                                + BODY], True),
    "HTTP 404": ([b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found"], False),
    "not HTTP": ([b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"], True),
    "closed with no answer": ([], True),
    "silence": ([], False),
}


class RawServer:
    """Each connection: read the request, write the scripted pieces, then close (or stay silent)."""

    def __init__(self, pieces: list[bytes], close: bool) -> None:
        self.pieces, self.close_after = pieces, close
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/metrics"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.open.append(conn)
        try:
            while True:
                request = b""
                while b"\r\n\r\n" not in request:
                    got = conn.recv(65536)
                    if not got:
                        return
                    request += got
                for piece in self.pieces:
                    conn.sendall(piece)
                    time.sleep(0.005)
                if self.close_after:
                    conn.close()
                    return
                if not self.pieces:
                    time.sleep(30)  # silence: the client's deadline must end it
                    return
        except OSError:
            pass

    def stop(self) -> None:
        self.listener.close()
        for conn in self.open:
            conn.close()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)


def _view(batch) -> tuple:
    """What a scrape stored and said, less its duration."""
    samples = [(m, lab, v) for m, lab, v in zip(batch.metrics, batch.labels, batch.values)
               if m != "scrape_duration_seconds"]
    return batch.status.ok, batch.status.error, sorted(samples, key=repr)


@pytest.mark.parametrize("name", list(ANSWERS))
def test_the_loop_fetch_reads_every_answer_as_the_blocking_fetch(name: str, loop) -> None:
    server = RawServer(*ANSWERS[name])
    try:
        blocking = VllmCollector(server.url, timeout_s=1.0, max_bytes=2 * len(BODY), fetch=None)
        on_loop = VllmCollector(server.url, timeout_s=1.0, max_bytes=2 * len(BODY))
        for now in (1000, 2000):  # twice: the second on a kept connection where the server keeps it
            want = _view(blocking.collect(now))
            got = _view(asyncio.run_coroutine_threadsafe(on_loop.collect_async(now), loop).result(30))
            assert got == want
        if name.startswith(("length", "chunked")) and "cut off" not in name:
            assert want[0] and want[2] and dict((m, v) for m, _l, v in want[2])["up"] == 1.0
        blocking.close()
        on_loop.close()
    finally:
        server.stop()


def test_a_refused_connection_reads_as_the_blocking_fetch(loop) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        blocking, on_loop = VllmCollector(url), VllmCollector(url)
        want = _view(blocking.collect(1000))
        got = _view(asyncio.run_coroutine_threadsafe(on_loop.collect_async(1000), loop).result(30))
    assert got == want and "connection refused" in (want[1] or "")


def test_a_silent_target_ends_at_its_deadline_and_holds_no_other(loop) -> None:
    silent, healthy = RawServer([], False), RawServer(*ANSWERS["length"])
    try:
        hung, good = VllmCollector(silent.url, timeout_s=2.0), VllmCollector(healthy.url, timeout_s=2.0)

        async def both():
            started = loop.time()
            stalled = asyncio.ensure_future(hung.collect_async(1000))
            answered = await good.collect_async(1000)
            answered_after = loop.time() - started
            return await stalled, answered, answered_after, loop.time() - started

        stalled, answered, answered_after, total = asyncio.run_coroutine_threadsafe(both(), loop).result(30)
        assert answered.status.ok and not stalled.status.ok
        assert "no complete answer within 2 s" in stalled.status.error
        assert answered_after < 1.5 <= total  # the healthy target's answer did not wait for the silent one
    finally:
        silent.stop()
        healthy.stop()
