"""The daemon's own HTTP port: /metrics (vllm_sentinel_*), /healthz (liveness) and /readyz (readiness).

/healthz answers 200 while the daemon works: the writer thread and the scheduler are alive and the
writer went round its loop lately. A wedged writer (a commit that never returns) fails it, so a
kubelet restarts the sidecar. /readyz answers 200 once the daemon records: the first collection
of every collector is done and the store can write; while the store cannot write (disk full),
it says so with 503. A vLLM target that is down does not make the sidecar unready: reporting it
is the sidecar's job. Both answer JSON, `{"ok": ..., "checks": {name: {"ok": ..., "detail": ...}}}`.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

Checks = Callable[[], dict[str, dict]]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class names it so
        pass  # probes every few seconds would flood the log


def health_app(registry: CollectorRegistry, live: Checks, ready: Checks):
    """The WSGI app: /healthz and /readyz from the checks, /metrics (and anything else) from the registry."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        checks = {"/healthz": live, "/readyz": ready}.get(path)
        if checks is None:
            if path not in ("/metrics", "/"):
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found: this port serves /metrics, /healthz and /readyz\n"]
            return metrics(environ, start_response)
        try:
            results = checks()
        except Exception as e:  # a check that breaks is a failed check, never a 200
            results = {"check": {"ok": False, "detail": f"{type(e).__name__}: {e}"}}
        ok = all(r["ok"] for r in results.values())
        body = json.dumps({"ok": ok, "checks": results}).encode() + b"\n"
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    return app


def serve_own_http(registry: CollectorRegistry, live: Checks, ready: Checks, port: int,
                   host: str = "127.0.0.1") -> ThreadingWSGIServer:
    """Serve the app on host:port in a daemon thread; returns the server (shutdown() stops it)."""
    server_class = ThreadingWSGIServer
    if ":" in host:  # an IPv6 address such as ::
        server_class = type("ThreadingWSGIServerV6", (ThreadingWSGIServer,), {"address_family": socket.AF_INET6})
    server = make_server(host, port, health_app(registry, live, ready), server_class, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="own-http", daemon=True).start()
    return server
