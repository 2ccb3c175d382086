"""GET a /metrics page: one deadline for connect, headers and body, a size cap, and a connection kept
between scrapes as Prometheus keeps it.

A new connection per scrape costs both ends a TCP handshake and leaves a TIME_WAIT socket behind
each time (16 targets at 1 s: about a thousand at any moment, every one a row the process
collectors read from /proc/net/tcp). `KeptConnection` sends every scrape of a target over one
HTTP/1.1 connection. A server closes an idle connection after its keep-alive timeout (uvicorn,
under vLLM: 5 s): such a connection is dropped before the request when the close has arrived, and
a request on a kept connection that fails before any byte of an answer is sent once more on a new
one.
"""

from __future__ import annotations

import http.client
import select
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import SplitResult, urlsplit

__all__ = ["ACCEPT", "Fetch", "KeptConnection", "Response", "ResponseTooLarge", "TruncatedBody", "http_fetch"]

# Plain text first: OpenMetrics from prometheus_client 0.26 renames samples to vllm_... while its
# # TYPE lines keep vllm:... (client_python#1177). Both are parsed if a proxy answers with either.
ACCEPT = "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
_READ_CHUNK = 256 * 1024
# what a kept connection the server closed meanwhile raises when used: sent again once on a new one
_GONE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


@dataclass
class Response:
    """What a fetch returns: HTTP status, Content-Type header and the body bytes."""

    status: int
    content_type: str
    body: bytes


class ResponseTooLarge(Exception):
    """The body passed the size limit; reading stopped there."""


class TruncatedBody(Exception):
    """The connection closed before the whole body arrived (shorter than its Content-Length)."""


Fetch = Callable[[str, float, int], Response]


def http_fetch(url: str, timeout_s: float, max_bytes: int) -> Response:
    """GET url on a connection of its own, closed after; one deadline for connect + headers + body."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    conn = _connect(parts, timeout_s, deadline)
    try:
        return _read(conn, _send(conn, parts, deadline), deadline, max_bytes)
    finally:
        conn.close()


class KeptConnection:
    """A Fetch over one connection kept between calls (one target's: never called from two threads at once)."""

    def __init__(self) -> None:
        self._conn: http.client.HTTPConnection | None = None
        self._origin: tuple | None = None

    def __call__(self, url: str, timeout_s: float, max_bytes: int) -> Response:
        deadline = time.monotonic() + timeout_s
        parts = urlsplit(url)
        origin = (parts.scheme, parts.hostname, parts.port)
        conn = self._conn if self._origin == origin and _open(self._conn) else None
        if conn is None:
            self.close()
        kept = conn is not None
        self._conn, self._origin = None, origin  # held again only after a whole answer
        try:
            if conn is None:
                conn = _connect(parts, timeout_s, deadline)
            try:
                resp = _send(conn, parts, deadline)
            except _GONE:
                if not kept:
                    raise
                conn.close()  # closed by the server while idle, the close still in flight: once more
                conn = _connect(parts, timeout_s, deadline)
                resp = _send(conn, parts, deadline)
            response = _read(conn, resp, deadline, max_bytes)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if conn.sock is not None:  # the server said it closes (Connection: close, HTTP/1.0): not kept
            self._conn = conn
        return response

    def close(self) -> None:
        """Close the kept connection, if any."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _open(conn: http.client.HTTPConnection | None) -> bool:
    """True when a kept connection can take a request: its socket is there and nothing (a close) is waiting on it."""
    if conn is None or conn.sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)  # readable while idle: the server's close (or bytes nobody asked for)
    except (OSError, ValueError):
        return False


def _connect(parts: SplitResult, timeout_s: float, deadline: float) -> http.client.HTTPConnection:
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.connect()
        if deadline - time.monotonic() <= 0:
            raise TimeoutError("connect took the whole timeout")
    except BaseException:
        conn.close()
        raise
    return conn


def _send(conn: http.client.HTTPConnection, parts: SplitResult, deadline: float) -> http.client.HTTPResponse:
    """The GET sent on an open connection, and its status line and headers."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("no time left for the request")
    conn.sock.settimeout(remaining)  # headers must arrive within what is left
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    conn.request("GET", path, headers={"Accept": ACCEPT, "Accept-Encoding": "identity",
                                       "User-Agent": "vllm-sentinel"})
    return conn.getresponse()


def _read(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, deadline: float,
          max_bytes: int) -> Response:
    """The body read to its end; raises past the deadline or max_bytes."""
    length = resp.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise ResponseTooLarge(f"Content-Length {length}")
    chunks: list[bytes] = []
    size = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("body not complete before the deadline")
        if conn.sock is not None:  # a slow server must not stretch one read past the deadline
            conn.sock.settimeout(remaining)
        chunk = resp.read1(_READ_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise ResponseTooLarge(f"more than {max_bytes} bytes")
        chunks.append(chunk)
    # http.client ends a plain body quietly at EOF; a cut-off chunked body raises IncompleteRead.
    if length is not None and length.isdigit() and size < int(length):
        raise TruncatedBody(f"{size} of {length} bytes")
    resp.close()  # read to its end: the connection takes the next request (read1 never marks that itself)
    return Response(resp.status, resp.getheader("Content-Type") or "", b"".join(chunks))
