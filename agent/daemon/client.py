"""The client side of the daemon's local API: GET a named route over its unix socket, JSON back."""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlencode

from vllm_sentinel.agent.daemon.paths import UnsafeSocketPath, check_socket


class ApiError(Exception):
    """The daemon answered with an error, or could not be reached."""


class DaemonNotRunning(ApiError):
    """No daemon listens on the socket (absent or stale)."""


class UnsafeSocket(ApiError):
    """The socket or its folder could have been planted by another user: not talked to."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def call(socket_path: str | Path, route: str, params: dict[str, object] | None = None,
         timeout: float = 60.0) -> dict:
    """GET a route of the daemon; DaemonNotRunning when nothing listens, UnsafeSocket when others could answer."""
    path = str(socket_path)
    if not os.path.exists(path):
        raise DaemonNotRunning(f"no daemon socket at {path}")
    try:  # another user's socket would get our request and send its own answers: never ask it
        check_socket(Path(path))
    except UnsafeSocketPath as e:
        raise UnsafeSocket(f"not asking the daemon: {e}") from None
    query = ("?" + urlencode({k: v for k, v in (params or {}).items() if v is not None})) if params else ""
    conn = _UnixConnection(path, timeout)
    try:
        conn.request("GET", route + query)
        resp = conn.getresponse()
        body = json.loads(resp.read() or b"{}")
    except (ConnectionRefusedError, FileNotFoundError) as e:
        raise DaemonNotRunning(f"the socket {path} exists but no daemon answers (stale): {e}") from e
    except PermissionError as e:
        raise ApiError(f"no permission to use {path}: run as the daemon's user") from e
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:
        raise ApiError(f"daemon at {path} did not answer properly: {e}") from e
    finally:
        conn.close()
    if resp.status != 200:
        raise ApiError(f"daemon at {path} answered {resp.status}: {body.get('error')}")
    return body


def answers(socket_path: str | Path) -> bool:
    """True when a daemon answers /v1/health on the socket within 2 s."""
    try:
        call(socket_path, "/v1/health", timeout=2.0)
        return True
    except ApiError:
        return False
