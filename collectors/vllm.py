"""Scrape a vLLM server's /metrics into a Batch, the way Prometheus scrapes a target.

Each collect() records `up`, `scrape_duration_seconds` and `scrape_samples_scraped` for the
target, renames old vLLM metric names to the canonical ones (collectors/aliases.py), and writes
one staleness marker (value None) for every series that disappeared since the last scrape, or
for all of them when the scrape failed. It never raises: a failure is a status with the fix.
"""

from __future__ import annotations

import errno
import http.client
import socket
import time
from urllib.parse import urlsplit, urlunsplit

from vllm_sentinel.collectors.aliases import resolve
from vllm_sentinel.collectors.base import Batch, CollectorStatus
from vllm_sentinel.collectors.exposition import ParseError, Shape, looks_openmetrics, parse
from vllm_sentinel.collectors.scrape_async import AsyncKeptConnection
from vllm_sentinel.collectors.scrape_http import (ACCEPT, Fetch, KeptConnection, Response, ResponseTooLarge,
                                                  TruncatedBody, http_fetch)
from vllm_sentinel.collectors.target_labels import TargetLabels

__all__ = ["ACCEPT", "Response", "ResponseTooLarge", "TruncatedBody", "VllmCollector", "http_fetch",
           "normalize_target"]

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # a 0.32 server with DP=8 sends well under 1 MiB


def normalize_target(target: str) -> str:
    """A target as an operator types it -> the /metrics URL: '127.0.0.1:8000' -> 'http://127.0.0.1:8000/metrics'."""
    url = target.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"target {target!r}: scheme must be http or https, e.g. http://127.0.0.1:8000")
    if not parts.hostname:
        raise ValueError(f"target {target!r} has no host; write it as http://HOST:PORT")
    try:
        parts.port  # noqa: B018 - raises on a non-numeric port
    except ValueError:
        raise ValueError(f"target {target!r} has an invalid port; write it as http://HOST:PORT") from None
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def default_instance(url: str) -> str:
    """The instance label Prometheus would give: host:port, with the scheme's default port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{host}:{port}"


class VllmCollector:
    """Scrapes one vLLM server's /metrics; `fetch` is injectable (default: a KeptConnection of its own)."""

    name = "vllm"

    def __init__(self, target_url: str, instance: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES,
                 fetch: Fetch | None = None, labels: dict[str, str] | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"scrape timeout must be positive, got {timeout_s}")
        if max_bytes <= 0:
            raise ValueError(f"response size limit must be positive, got {max_bytes}")
        self.url = normalize_target(target_url)
        self.instance = instance or default_instance(self.url)
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._fetch: Fetch = fetch or KeptConnection()
        # with the default fetch, a daemon may run the scrape on its asyncio loop instead of a thread;
        # an injected fetch is blocking, so there is no async form of it
        self._fetch_async = AsyncKeptConnection() if fetch is None else None
        self.collect_async = self._collect_async if fetch is None else None
        self.target_labels = TargetLabels(labels)  # a targets file's labels, on every series of this target
        # (metric, label text) of every series in the last successful scrape, for staleness
        self._live: set[tuple[str, str]] = set()
        # the last body's shape, and what was derived from it (canonical names, renames, labels with the
        # target's): a body of the same shape holds the same series, so only its values are new
        self._shape: Shape | None = None
        self._derived: tuple[list[str], dict[str, str], list[str]] | None = None
        self.last_status: CollectorStatus | None = None

    def collect(self, now_ms: int) -> Batch:
        """Scrape once; never raises. Failures give `up 0`, stale markers and a status with the fix."""
        started = time.monotonic()
        try:
            outcome: Response | Exception = self._fetch(self.url, self.timeout_s, self.max_bytes)
        except Exception as exc:  # one bad target must never stop the sidecar
            outcome = exc
        return self._batch(now_ms, started, outcome)

    async def _collect_async(self, now_ms: int) -> Batch:
        """collect() on an asyncio loop: the fetch waits without a thread, the body is read on the loop."""
        started = time.monotonic()
        try:
            outcome: Response | Exception = await self._fetch_async(self.url, self.timeout_s, self.max_bytes)
        except Exception as exc:  # one bad target must never stop the sidecar
            outcome = exc
        return self._batch(now_ms, started, outcome)

    def _batch(self, now_ms: int, started: float, outcome: Response | Exception) -> Batch:
        """The scrape's Batch from what the fetch returned or raised."""
        batch = Batch(instance=self.instance, ts_ms=now_ms)
        detail: dict[str, object] = {"target": self.url}
        error: str | None = None
        up = 0.0
        samples = 0
        try:
            if isinstance(outcome, Exception):
                raise outcome
            error = self._check_response(outcome)
            if error is None:
                error, samples = self._add_samples(batch, outcome, detail)
                up = 1.0 if samples else 0.0
        except Exception as exc:  # one bad target must never stop the sidecar
            error = self._explain(exc)
        if up == 0.0:
            self._mark_all_stale(batch)
        duration = time.monotonic() - started
        own = self.target_labels.text
        batch.add("up", own, up)
        batch.add("scrape_duration_seconds", own, duration)
        batch.add("scrape_samples_scraped", own, float(samples))
        detail.update(duration_s=round(duration, 6), samples=samples)
        batch.status = CollectorStatus(name=f"{self.name} {self.instance}", ok=error is None,
                                       error=error, detail=detail)
        self.last_status = batch.status
        return batch

    def _check_response(self, response: Response) -> str | None:
        if response.status != 200:
            hint = (" (is this the vLLM API server's port? /metrics is served by "
                    "`python -m vllm.entrypoints.openai.api_server`)" if response.status == 404 else "")
            return f"{self.url} answered HTTP {response.status}{hint}"
        return None

    def _add_samples(self, batch: Batch, response: Response,
                     detail: dict[str, object]) -> tuple[str | None, int]:
        """Parse the body into the batch; returns (error or None, samples kept)."""
        text = response.body.decode("utf-8", errors="replace")
        openmetrics = looks_openmetrics(text, response.content_type)
        if openmetrics and not looks_openmetrics(text):
            # OpenMetrics ends with '# EOF' so a cut-off body shows (Prometheus fails it, too).
            return (f"{self.url}: OpenMetrics body has no final '# EOF' line: cut off in transit; "
                    "nothing of this scrape was kept (check a proxy's buffer and timeouts)"), 0
        # Lenient: one odd line (say, from a third-party KV connector) must not blind the sidecar
        # to every other metric; the status names the line so it can be reported upstream.
        parsed = parse(text, openmetrics=openmetrics, strict=False, shape=self._shape, keep_shape=True)
        detail["content_type"] = response.content_type
        same_series = parsed.shape is not None and parsed.shape is self._shape and self._derived is not None
        if same_series:
            metrics, renames, labels = self._derived
        else:
            metrics, renames = resolve(parsed.names)
        if not any(name.startswith("vllm:") for name in metrics):
            self._shape = self._derived = None
            if parsed.errors:
                first = parsed.errors[0]
                return (f"{self.url} did not return Prometheus metrics: malformed line "
                        f"{first.line_no}: {first.line[:80]!r} (is this the vLLM API server's port?)"), 0
            return (f"{self.url} has no vllm: metrics ({len(parsed.names)} other samples): "
                    "not a vLLM server, or vLLM runs with --disable-log-stats (drop that flag)"), 0
        if renames:
            batch.sources = {canonical: source for source, canonical in renames.items()}
        if not same_series:
            labels = self.target_labels.apply_all(parsed.labels)
        batch.metrics.extend(metrics)
        batch.labels.extend(labels)
        batch.values.extend(parsed.values)
        batch.timestamps_ms.extend(parsed.timestamps_ms)
        if not same_series:  # the same series as last time: none went stale
            live = set(zip(metrics, labels))
            for metric, labels_text in self._live - live:  # gone since the last scrape: one stale marker
                batch.add(metric, labels_text, None)
            self._live = live
            self._shape = parsed.shape
            self._derived = (metrics, renames, labels) if parsed.shape is not None else None
        error = None
        if parsed.errors:
            first = parsed.errors[0]
            detail["malformed_lines"] = len(parsed.errors)
            error = (f"{self.url}: skipped {len(parsed.errors)} malformed line(s), first {first} "
                     "(kept the other samples; report it to whoever exports that metric)")
        return error, len(metrics)

    def close(self) -> None:
        """Close the connection kept to the target (the sidecar calls this when the target goes)."""
        for fetch in (self._fetch, self._fetch_async):
            close = getattr(fetch, "close", None)
            if close is not None:
                close()

    def retire(self, now_ms: int) -> Batch:
        """The target is gone from the targets: a stale marker for each of its series, `up` and scrape_* included.

        As Prometheus ends the series of a target that service discovery dropped.
        """
        batch = Batch(instance=self.instance, ts_ms=now_ms)
        self._mark_all_stale(batch)
        for name in ("up", "scrape_duration_seconds", "scrape_samples_scraped"):
            batch.add(name, self.target_labels.text, None)
        return batch

    def _mark_all_stale(self, batch: Batch) -> None:
        for metric, labels in self._live:
            batch.add(metric, labels, None)
        self._live = set()
        self._shape = self._derived = None  # the next body is compared with nothing

    def _explain(self, exc: Exception) -> str:
        """One line: what failed and the fix."""
        url = self.url
        if isinstance(exc, ResponseTooLarge):
            return (f"{url}: response larger than the limit of {self.max_bytes} bytes ({exc}); "
                    "raise --scrape-max-bytes if this is really vLLM")
        if isinstance(exc, (TruncatedBody, http.client.IncompleteRead)):
            # a chunked body's byte count is left out: http.client's read1 knows only the current chunk's
            cut = f"body cut off after {exc}" if isinstance(exc, TruncatedBody) else "chunked body cut off"
            return (f"{url}: {cut} (the server or a proxy closed the connection "
                    "early); nothing of this scrape was kept: check the proxy's buffer and timeouts, "
                    "or the vLLM server's log for a crash")
        if isinstance(exc, ConnectionRefusedError):
            return f"{url}: connection refused: is vLLM running and listening on that port?"
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return (f"{url}: no complete answer within {self.timeout_s:g} s: the server is "
                    "overloaded or hung; raise --scrape-timeout if it is just slow")
        if isinstance(exc, socket.gaierror):
            return f"{url}: host name does not resolve ({exc.strerror}): check the --target host"
        if isinstance(exc, ConnectionResetError) or isinstance(exc, http.client.RemoteDisconnected):
            return f"{url}: connection closed before a full answer: is vLLM restarting?"
        if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return f"{url}: host unreachable: check the network path to the target"
        if isinstance(exc, http.client.HTTPException):
            return f"{url}: not a valid HTTP answer ({type(exc).__name__}): is this an HTTP port?"
        if isinstance(exc, ParseError):
            return f"{url}: malformed {exc}"
        return f"{url}: scrape failed: {type(exc).__name__}: {exc}"
