"""The daemon's local API server: JSON over HTTP on a unix socket (mode 0600), so readers never fight DuckDB's lock.

Routes are named operations (never raw SQL): GET /v1/health, /v1/status, /v1/diagnose?..., /v1/compare?... read;
/v1/capture and /v1/report write (stacks into the store, a report to disk). The client is client.py.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from vllm_sentinel.agent.daemon.client import ApiError, answers
from vllm_sentinel.agent.daemon.paths import UnsafeSocketPath, prepare_socket_dir

Handler = Callable[[dict[str, str]], dict]

class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


class ApiServer:
    """Serves the daemon's named operations (its routes) on a unix socket."""

    def __init__(self, socket_path: str | Path, routes: dict[str, Handler]):
        self.socket_path = Path(socket_path)
        self.routes = routes
        self._server: _UnixHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind the socket (replacing a stale one, refusing a live one) and serve in a thread."""
        path = self.socket_path
        try:  # a folder another user can write lets them swap the socket for their own
            prepare_socket_dir(path)
        except UnsafeSocketPath as e:
            raise ApiError(f"not starting the API: {e}") from None
        if path.exists():
            if answers(path):
                raise ApiError(f"another vllm-sentinel daemon already serves {path}; "
                               "stop it or give this one another --db")
            path.unlink()
        routes = self.routes

        class RequestHandler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                url = urlparse(self.path)
                route = routes.get(url.path)
                if route is None:
                    return self._send(404, {"error": f"no route {url.path}"})
                params = {k: v[-1] for k, v in parse_qs(url.query).items()}
                try:
                    self._send(200, route(params))
                except Exception as e:  # the daemon must survive any bad request
                    self._send(500, {"error": f"{type(e).__name__}: {e}"})

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def address_string(self) -> str:
                return "unix"

            def log_message(self, *args: object) -> None:
                pass  # the daemon logs through its own logger, not stderr per request

        old_umask = os.umask(0o177)  # the socket is created 0600: only the owner may ask
        try:
            self._server = _UnixHTTPServer(str(path), RequestHandler)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        self._thread = threading.Thread(target=self._server.serve_forever, name="api", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
