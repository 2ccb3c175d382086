"""GET a /metrics page from an asyncio loop: every target's scrapes on one thread, none blocking another.

The same contract as `scrape_http.KeptConnection` (one deadline for connect, headers and body, a size
cap, one HTTP/1.1 connection kept between a target's scrapes, a request on a kept connection the server
closed meanwhile sent once more on a new one) and the same exceptions, so a failed scrape reads the same.
A thread per target cost the daemon more in waking and switching threads than the scrape itself: one
loop multiplexes every target's socket, and a target that hangs only holds its own request.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import socket
import ssl
import threading
from urllib.parse import urlsplit

from vllm_sentinel.collectors.scrape_http import ACCEPT, Response, ResponseTooLarge, TruncatedBody

__all__ = ["AsyncKeptConnection"]

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; http.client allows 100 headers of 64 KiB each
_CLOSE_LOCK = threading.Lock()  # closing after the loop stopped runs it briefly: one closer at a time


class AsyncKeptConnection:
    """An async Fetch over one kept connection (one target's: never two requests at once)."""

    def __init__(self) -> None:
        self._proto: _Answer | None = None
        self._origin: tuple | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tls: ssl.SSLContext | None = None
        self._closed = False  # close() was called: a request in flight does not keep its connection

    async def __call__(self, url: str, timeout_s: float, max_bytes: int) -> Response:
        loop = asyncio.get_running_loop()
        self._loop = loop
        deadline = loop.time() + timeout_s
        parts = urlsplit(url)
        origin = (parts.scheme, parts.hostname, parts.port)
        proto = self._proto if self._origin == origin and self._proto is not None and self._proto.idle() else None
        if proto is None:
            self._drop()
        kept = proto is not None
        self._proto, self._origin = None, origin  # held again only after a whole answer
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = (f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: {ACCEPT}\r\n"
                   "Accept-Encoding: identity\r\nUser-Agent: vllm-sentinel\r\n\r\n").encode("latin-1")
        try:
            if proto is None:
                proto = await self._connect(parts, deadline)
            try:
                answer = await _within(proto.ask(request, max_bytes), deadline)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not kept:
                    raise
                proto.close()  # closed by the server while idle, the close still in flight: once more
                proto = await self._connect(parts, deadline)
                answer = await _within(proto.ask(request, max_bytes), deadline)
        except BaseException:
            if proto is not None:
                proto.close()
            raise
        if proto.reusable() and not self._closed:
            self._proto = proto
        else:
            proto.close()
        return answer

    async def _connect(self, parts, deadline: float) -> _Answer:
        loop = asyncio.get_running_loop()
        host, https = parts.hostname or "", parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        tls = None
        if https:
            if self._tls is None:
                self._tls = ssl.create_default_context()  # verified, as http.client's default
            tls = self._tls
        if _literal(host):  # no resolver round trip (it runs on a thread) for an address
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            addresses = [(family, (host, port))]
        else:
            found = await _within(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), deadline)
            addresses = [(f, a) for f, _t, _p, _c, a in found]
        error: BaseException | None = None
        for family, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await _within(loop.sock_connect(sock, address), deadline)
                _transport, proto = await _within(loop.create_connection(
                    lambda s=sock: _Answer(s), sock=sock, ssl=tls, server_hostname=host if tls else None), deadline)
                return proto
            except TimeoutError:
                sock.close()
                raise
            except OSError as e:
                sock.close()
                error = e
        raise error if error is not None else OSError(f"{host} resolved to no address")

    def _drop(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None:
            proto.close()

    def close(self) -> None:
        """Close the kept connection, if any; from any thread, the loop running or stopped."""
        loop, proto = self._loop, self._proto
        self._proto, self._closed = None, True
        if proto is None or loop is None or loop.is_closed():
            return
        if loop.is_running():
            if _on_loop(loop):
                proto.close()
            else:
                loop.call_soon_threadsafe(proto.close)
            return
        with _CLOSE_LOCK:  # the loop has stopped: run it once so the socket is really closed
            proto.close()
            if not loop.is_running():
                loop.run_until_complete(asyncio.sleep(0))


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _within(awaitable, deadline: float):
    """awaitable's result, or TimeoutError once the deadline passes (what it was doing is cancelled)."""
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        if asyncio.isfuture(awaitable):
            awaitable.cancel()
        elif asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise TimeoutError("no time left for the request")
    try:
        return await asyncio.wait_for(awaitable, remaining)
    except asyncio.TimeoutError:  # an alias of TimeoutError from 3.11; not on 3.10
        raise TimeoutError("no complete answer before the deadline") from None


class _Answer(asyncio.Protocol):
    """One connection: a request written, its answer read as it arrives (Content-Length, chunked, or to EOF)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # closed by the transport; kept to know the connection is ours
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._done: asyncio.Future | None = None
        self._ended = False  # EOF or connection lost
        self._stray = False  # bytes while no request was out: the connection's framing is lost

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # noqa: D102
        self.transport = transport

    def data_received(self, data: bytes) -> None:  # noqa: D102
        if self._done is None or self._done.done():
            self._stray = True
            return
        self._buf += data
        self._advance()

    def eof_received(self) -> bool:  # noqa: D102
        self._ended = True
        self._advance()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._ended = True
        self._advance()

    # -- one request ----------------------------------------------------------------------------
    def idle(self) -> bool:
        """Can take a request: open, nothing arrived since the last answer (a server's close, stray bytes)."""
        return (self.transport is not None and not self.transport.is_closing() and not self._ended
                and not self._stray)

    def reusable(self) -> bool:
        """After an answer: the server keeps the connection and sent nothing past the answer."""
        return self.idle() and self._keep and not self._buf

    def close(self) -> None:
        """Close the connection (a pending answer fails)."""
        if self.transport is not None:
            self.transport.close()

    def ask(self, request: bytes, max_bytes: int) -> asyncio.Future:
        """Send the request; the future gets the Response or the exception http.client would raise."""
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._buf.clear()
        self._max = max_bytes
        self._head: tuple[int, str, dict[str, str]] | None = None
        self._keep = False
        self._length: int | None = None  # Content-Length
        self._chunked = False
        self._chunks: list[bytes] = []
        self._size = 0
        self._chunk_left = -1  # bytes left of the current chunk; -1: a size line comes next
        self._trailer = False
        self.transport.write(request)
        return self._done

    def _advance(self) -> None:
        done = self._done
        if done is None or done.done():
            return
        try:
            result = self._step()
        except Exception as exc:  # what the answer's bytes are wrong with: the scrape's error
            self._keep = False
            done.set_exception(exc)
            return
        if result is not None:
            done.set_result(result)

    def _step(self) -> Response | None:
        if self._head is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise http.client.LineTooLong("header block")
                if self._ended:
                    if not self._buf:
                        raise http.client.RemoteDisconnected("Remote end closed connection without response")
                    raise http.client.BadStatusLine(bytes(self._buf[:80]).decode("latin-1"))
                return None
            self._read_head(bytes(self._buf[:end]).decode("latin-1"))
            del self._buf[:end + 4]
            if self._head is None:  # a 1xx answer: the real one follows
                return self._step()
        if self._chunked:
            return self._step_chunked()
        if self._length is not None:
            got = len(self._buf)
            if got >= self._length:
                body = bytes(self._buf[:self._length])
                del self._buf[:self._length]
                return self._answer(body)
            if self._ended:
                raise TruncatedBody(f"{got} of {self._length} bytes")
            return None
        if len(self._buf) > self._max:
            raise ResponseTooLarge(f"more than {self._max} bytes")
        if self._ended:  # no length: the body ends with the connection
            body = bytes(self._buf)
            self._buf.clear()
            return self._answer(body)
        return None

    def _read_head(self, head: str) -> None:
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise http.client.BadStatusLine(lines[0][:80])
        status = int(parts[1])
        if 100 <= status < 200:
            return  # informational (100 Continue): skipped, as http.client does
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise http.client.HTTPException(f"malformed header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        self._head = (status, headers.get("content-type", ""), headers)
        connection = headers.get("connection", "").lower()
        self._keep = parts[0] == "HTTP/1.1" and "close" not in connection
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise http.client.HTTPException(f"Content-Length {length[:40]!r} is not a number")
            if int(length) > self._max:
                raise ResponseTooLarge(f"Content-Length {length}")
            self._length = int(length)
        elif status in (204, 304):
            self._length = 0
        else:
            self._keep = False  # the body ends when the server closes

    def _step_chunked(self) -> Response | None:
        buf = self._buf
        pos = 0
        while True:
            if self._trailer:  # after the last chunk: trailer lines up to an empty one
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                line_empty = end == pos
                pos = end + 2
                if line_empty:
                    del buf[:pos]
                    return self._answer(b"".join(self._chunks))
                continue
            if self._chunk_left < 0:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > 1024:
                        raise http.client.HTTPException("chunk size line too long")
                    break
                size_text = bytes(buf[pos:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise http.client.HTTPException(f"bad chunk size {size_text[:20]!r}") from None
                pos = end + 2
                if size == 0:
                    self._trailer = True
                    continue
                if self._size + size > self._max:
                    raise ResponseTooLarge(f"more than {self._max} bytes")
                self._chunk_left = size
            if len(buf) - pos < self._chunk_left + 2:
                break
            self._chunks.append(bytes(buf[pos:pos + self._chunk_left]))
            self._size += self._chunk_left
            pos += self._chunk_left + 2  # the chunk's CRLF
            self._chunk_left = -1
        del buf[:pos]
        if self._ended:
            raise http.client.IncompleteRead(b"".join(self._chunks))
        return None

    def _answer(self, body: bytes) -> Response:
        assert self._head is not None
        status, content_type, _headers = self._head
        return Response(status, content_type, body)
