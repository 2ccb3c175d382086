"""A client for a remote Prometheus' HTTP API (or Thanos, Mimir, VictoriaMetrics: the same API).

Reads history, never writes. `PrometheusClient(PrometheusConnection(url, ...))` offers instant
queries, range queries and label values; every failure is a `PrometheusError` with one line that
names the server, what went wrong and the fix (Prometheus' own `error` field quoted on 4xx/5xx).

Range queries are split so that no request asks for more than Prometheus' 11,000 points per series,
on the step grid of the whole query (the pieces join without a gap or a duplicate). Many queries
run at once through `query_ranges`/`queries`, at most `max_concurrency` requests in flight.

    client = PrometheusClient(PrometheusConnection("http://prometheus:9090", bearer_token_file="/run/token"))
    [series] = client.query_range('sum(rate(vllm:prompt_tokens_total[1m]))', start_ms, end_ms, 5_000)
    series.labels, series.points[:1]      # {} [(1796000000000, 12.5)]
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Prometheus refuses a range query of more than this many points per series (web/api/v1/api.go)
MAX_POINTS_PER_SERIES = 11_000
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONCURRENCY = 4
MAX_BODY_BYTES = 512 << 20  # a runaway answer must not take the host's memory


class PrometheusError(Exception):
    """A Prometheus request failed; the message is one line naming the server, the problem and the fix."""


class PrometheusQueryError(PrometheusError):
    """Prometheus refused or failed one query (HTTP 400 bad_data, 422 execution): the query, not the server."""


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: labels (with __name__ when kept) and (t_ms, value) points in time order."""

    labels: dict[str, str]
    points: list[tuple[int, float]]


@dataclass(frozen=True)
class InstantSample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class PrometheusConnection:
    """Where a Prometheus is and how to talk to it: the flags `--prometheus` comes with."""

    url: str
    bearer_token_file: str | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_concurrency: int = DEFAULT_CONCURRENCY
    headers: dict[str, str] = field(default_factory=dict)  # extra headers (a tenant id for Mimir, ...)


def _read_secret(path: str, flag: str) -> str:
    """The first line of a secret file, stripped (as Prometheus reads bearer_token_file / password_file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PrometheusError(f"{flag} {path}: cannot read it ({e.__class__.__name__}: "
                              f"{getattr(e, 'strerror', None) or e}); give a readable file") from None
    secret = text.strip()
    if not secret or "\n" in secret:
        raise PrometheusError(f"{flag} {path}: expected one line holding the secret, found "
                              f"{'nothing' if not secret else 'several lines'}")
    return secret


def auth_headers(conn: PrometheusConnection) -> dict[str, str]:
    """The Authorization header the connection asks for (bearer token or basic auth), read from its files."""
    if conn.bearer_token_file and (conn.basic_auth_user or conn.basic_auth_password_file):
        raise PrometheusError("--bearer-token-file and --basic-auth-user are two ways to authenticate: give one")
    if conn.bearer_token_file:
        return {"Authorization": "Bearer " + _read_secret(conn.bearer_token_file, "--bearer-token-file")}
    if conn.basic_auth_password_file and not conn.basic_auth_user:
        raise PrometheusError("--basic-auth-password-file needs --basic-auth-user")
    if conn.basic_auth_user:
        if ":" in conn.basic_auth_user:
            raise PrometheusError(f"--basic-auth-user {conn.basic_auth_user!r}: a user name cannot hold ':'")
        password = (_read_secret(conn.basic_auth_password_file, "--basic-auth-password-file")
                    if conn.basic_auth_password_file else "")
        token = base64.b64encode(f"{conn.basic_auth_user}:{password}".encode()).decode()
        return {"Authorization": "Basic " + token}
    return {}


def tls_context(conn: PrometheusConnection) -> ssl.SSLContext | None:
    """The TLS settings for an https URL: the system CAs, or --ca-file, or no verification at all."""
    if not conn.url.startswith("https://"):
        if conn.ca_file or conn.insecure_skip_verify:
            raise PrometheusError(f"--ca-file and --insecure-skip-verify apply to https URLs; {conn.url} is plain http")
        return None
    if conn.insecure_skip_verify:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=conn.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise PrometheusError(f"--ca-file {conn.ca_file}: cannot load it as PEM certificates ({e}); "
                              "give the CA that signed the server's certificate") from None


def split_range(start_ms: int, end_ms: int, step_ms: int, max_points: int = MAX_POINTS_PER_SERIES) -> list[tuple[int, int]]:
    """Pieces of a range query on one step grid, each of at most `max_points` evaluation times.

    split_range(0, 25_000, 1000, max_points=10) -> [(0, 9000), (10000, 19000), (20000, 25000)]
    """
    if step_ms <= 0:
        raise PrometheusError(f"range query step must be positive, got {step_ms} ms")
    if end_ms < start_ms:
        return []
    span = (max_points - 1) * step_ms
    out, s = [], start_ms
    while s <= end_ms:
        e = min(s + span, end_ms)
        out.append((s, e))
        s = e - (e - s) % step_ms + step_ms
    return out


def _value(text: str) -> float:
    """Prometheus' value strings: '1.5', 'NaN', '+Inf', '-Inf'."""
    return float(text)


def _seconds(ms: int) -> str:
    """Milliseconds as Prometheus' time parameter: 1796000000123 -> '1796000000.123'."""
    return f"{ms // 1000}.{ms % 1000:03d}"


class PrometheusClient:
    """Queries against one Prometheus server; thread-safe (each request is its own connection)."""

    def __init__(self, conn: PrometheusConnection):
        parsed = urllib.parse.urlsplit(conn.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"--prometheus {conn.url!r}: give the server's base URL, "
                                  "such as http://prometheus:9090")
        if conn.max_concurrency < 1:
            raise PrometheusError(f"query concurrency must be at least 1, got {conn.max_concurrency}")
        self.conn = conn
        self.base = conn.url.rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": "vllm-sentinel", **conn.headers,
                         **auth_headers(conn)}
        self._tls = tls_context(conn)

    @property
    def url(self) -> str:
        """The server's base URL, as given."""
        return self.conn.url

    # -- one request ---------------------------------------------------------------------------
    def _request(self, path: str, params: dict[str, str] | list[tuple[str, str]], what: str,
                 get: bool = False) -> object:
        """POST a form to an API path (or GET it) and return its `data`; PrometheusError otherwise."""
        body = urllib.parse.urlencode(params).encode()
        if get:
            req = urllib.request.Request(f"{self.base}{path}?{body.decode()}", headers=self._headers)
        else:
            req = urllib.request.Request(f"{self.base}{path}", data=body, method="POST",
                                         headers={**self._headers,
                                                  "Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(req, timeout=self.conn.timeout_s, context=self._tls) as resp:  # noqa: S310
                raw = resp.read(MAX_BODY_BYTES + 1)
        except urllib.error.HTTPError as e:
            kind = PrometheusQueryError if e.code in (400, 422) else PrometheusError
            raise kind(self._http_error(e, what)) from None
        except (TimeoutError, socket.timeout):
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.conn.timeout_s:g} s "
                                  f"({what}); shorten --since, narrow --selector or raise --prometheus-timeout") from None
        except urllib.error.URLError as e:
            raise PrometheusError(self._unreachable(e.reason)) from None
        except (OSError, ValueError) as e:  # a reset connection, a bad chunk
            raise PrometheusError(self._unreachable(e)) from None
        if len(raw) > MAX_BODY_BYTES:
            raise PrometheusError(f"Prometheus at {self.url} answered over {MAX_BODY_BYTES >> 20} MiB ({what}); "
                                  "narrow --selector or shorten --since")
        return self._data(raw, what)

    def _data(self, raw: bytes, what: str) -> object:
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{self.url} did not answer with Prometheus' API (not JSON: "
                                  f"{raw[:80]!r}); is this the server's base URL?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success" or "data" not in doc:
            err = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"Prometheus at {self.url} failed {what}: {err or 'no data in its answer'}")
        return doc["data"]

    def _http_error(self, e: urllib.error.HTTPError, what: str) -> str:
        try:
            doc = json.loads(e.read(65536) or b"{}")
            detail = doc.get("error") if isinstance(doc, dict) else None
            kind = doc.get("errorType") if isinstance(doc, dict) else None
        except ValueError:
            detail, kind = None, None
        head = f"Prometheus at {self.url} answered HTTP {e.code}" + (f" ({kind})" if kind else "")
        if e.code in (401, 403):
            return (f"{head} to {what}: {detail or e.reason}; check --bearer-token-file or "
                    "--basic-auth-user/--basic-auth-password-file")
        if e.code == 404:
            return f"{head} to {what}: no Prometheus API under {self.base}/api/v1; give the server's base URL"
        return f"{head} to {what}: {' '.join(str(detail or e.reason).split())}"

    def _unreachable(self, reason: object) -> str:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return (f"TLS verification of {self.url} failed ({reason.verify_message}); pass --ca-file with the "
                    "CA that signed its certificate, or --insecure-skip-verify")
        if isinstance(reason, ssl.SSLError):
            return f"TLS with {self.url} failed ({reason.reason or reason}); is it https, and the port right?"
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return f"Prometheus at {self.url} did not answer within {self.conn.timeout_s:g} s; is it up?"
        if isinstance(reason, ConnectionRefusedError):
            return f"cannot reach Prometheus at {self.url}: connection refused; is it running, is --prometheus right?"
        if isinstance(reason, socket.gaierror):
            return f"cannot reach Prometheus at {self.url}: the host name does not resolve; check --prometheus"
        return f"cannot reach Prometheus at {self.url}: {reason}; check --prometheus"

    # -- queries ---------------------------------------------------------------------------------
    def query(self, expr: str, t_ms: int) -> list[InstantSample] | float:
        """An instant query at t_ms: a vector (list of samples) or a scalar."""
        data = self._request("/api/v1/query", {"query": expr, "time": _seconds(t_ms)}, f"the query {expr!r}")
        kind, result = data.get("resultType"), data.get("result")  # type: ignore[union-attr]
        if kind == "scalar":
            return _value(result[1])
        if kind != "vector":
            raise PrometheusError(f"Prometheus at {self.url} answered {expr!r} with a {kind}, not a vector or scalar")
        return [InstantSample(dict(s["metric"]), _value(s["value"][1])) for s in result]

    def _range_piece(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[RangeSeries]:
        params = {"query": expr, "start": _seconds(start_ms), "end": _seconds(end_ms), "step": f"{step_ms / 1000:g}"}
        data = self._request("/api/v1/query_range", params, f"the range query {expr!r}")
        if data.get("resultType") != "matrix":  # type: ignore[union-attr]
            raise PrometheusError(f"Prometheus at {self.url} answered the range query {expr!r} with "
                                  f"{data.get('resultType')}, not a matrix")  # type: ignore[union-attr]
        return [RangeSeries(dict(s["metric"]), [(round(float(t) * 1000), _value(v)) for t, v in s["values"]])
                for s in data["result"]]  # type: ignore[index]

    def query_range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[RangeSeries]:
        """A range query over [start_ms, end_ms] at step_ms, split under the points limit and joined."""
        return self.query_ranges([(expr, start_ms, end_ms, step_ms)])[0]

    def query_ranges(self, queries: list[tuple[str, int, int, int]]) -> list[list[RangeSeries]]:
        """Several range queries at once (bounded concurrency); results in the order asked."""
        pieces = [(i, expr, s, e, step) for i, (expr, start, end, step) in enumerate(queries)
                  for s, e in split_range(start, end, step)]
        answers = self._run([lambda p=p: self._range_piece(*p[1:]) for p in pieces])
        joined: list[dict[tuple, RangeSeries]] = [{} for _ in queries]
        for (i, *_rest), series in zip(pieces, answers):
            for s in series:
                key = tuple(sorted(s.labels.items()))
                have = joined[i].get(key)
                if have is None:
                    joined[i][key] = RangeSeries(s.labels, list(s.points))
                else:
                    have.points.extend(s.points)
        return [list(j.values()) for j in joined]

    def queries(self, queries: list[tuple[str, int]]) -> list[list[InstantSample] | float]:
        """Several instant queries at once (bounded concurrency); results in the order asked."""
        return self._run([lambda q=q: self.query(*q) for q in queries])

    def label_values(self, label: str, match: list[str], start_ms: int, end_ms: int) -> list[str]:
        """Values of `label` on the series matching any of `match` with samples in [start_ms, end_ms]."""
        params = [("match[]", m) for m in match] + [("start", _seconds(start_ms)), ("end", _seconds(end_ms))]
        path = f"/api/v1/label/{urllib.parse.quote(label, safe='')}/values"
        # label values are GET only in Prometheus 2.x
        data = self._request(path, params, f"the values of label {label!r}", get=True)
        return sorted(str(v) for v in data)  # type: ignore[union-attr]

    def _run(self, calls: list) -> list:
        """Run the calls with at most max_concurrency in flight; the first failure is raised."""
        if len(calls) <= 1 or self.conn.max_concurrency == 1:
            return [c() for c in calls]
        with ThreadPoolExecutor(max_workers=min(self.conn.max_concurrency, len(calls)),
                                thread_name_prefix="prometheus-query") as pool:
            futures = [pool.submit(c) for c in calls]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
