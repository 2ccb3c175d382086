"""A bounded load generator for an OpenAI-compatible /v1/completions endpoint (stdlib only).

Drives the real vLLM server in the demo and the integration tests so that queueing, preemption and
token counters move. Every run is bounded twice: by a request count and by a deadline, and each
HTTP call has its own timeout, so a run always ends by itself.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass, field, replace

# Words that the tiny model's tokenizer keeps whole (it was trained on them), so one word is about
# one prompt token there; other tokenizers only make prompts somewhat longer.
_WORDS = (
    "the server receives requests places them in queue and schedules batches each request has "
    "prompt asks for number of new tokens scheduler decides which run next step how many are "
    "processed must wait when key value cache is full running preempted its blocks freed computed "
    "again later operators watch time first token per output waiting usage good system tells why "
    "serving slow parameter change what evidence supports model reads predicts repeats until"
).split()

# Hard cap on requests when only a duration is given: keeps a runaway plan finite.
MAX_REQUESTS = 100_000
_MAX_ERRORS_KEPT = 20


class TrafficError(ValueError):
    """A traffic plan that cannot run (unbounded, or nonsensical numbers)."""


@dataclass(frozen=True)
class TrafficPlan:
    """What to send: how many, how fast, how long the prompts and answers are."""

    requests: int | None = 20  # total requests; None only with duration_s
    duration_s: float | None = None  # no new request starts after this many seconds
    concurrency: int = 2  # worker threads, i.e. requests in flight at most
    prompt_tokens: int = 32  # approximate prompt length (words) of a short request
    max_tokens: int = 16
    long_prompt_tokens: int | None = None  # with long_every: the mix of long and short prompts
    long_every: int = 0  # every k-th request (by index) is long; 0: none
    interval_s: float = 0.0  # pause per worker between its requests (steady light load)
    ignore_eos: bool = True  # vLLM extension: generate exactly max_tokens, so counts are predictable
    request_timeout_s: float = 120.0
    seed: int = 0

    def validate(self) -> None:
        """Raise TrafficError unless the plan is bounded and its numbers make sense."""
        if self.requests is None and self.duration_s is None:
            raise TrafficError("set requests or duration_s (or both): an unbounded run never ends")
        if self.requests is not None and not 0 < self.requests <= MAX_REQUESTS:
            raise TrafficError(f"requests must be 1..{MAX_REQUESTS}, got {self.requests}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise TrafficError(f"duration_s must be positive, got {self.duration_s}")
        if self.concurrency < 1:
            raise TrafficError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.prompt_tokens < 1 or self.max_tokens < 1:
            raise TrafficError("prompt_tokens and max_tokens must be at least 1")
        if self.long_every and not self.long_prompt_tokens:
            raise TrafficError("long_every needs long_prompt_tokens")

    def prompt_tokens_for(self, index: int) -> int:
        """Prompt length of request `index`: long for every long_every-th request, else short."""
        if self.long_every and self.long_prompt_tokens and index % self.long_every == 0:
            return self.long_prompt_tokens
        return self.prompt_tokens


def steady(requests: int = 20, concurrency: int = 2, interval_s: float = 0.2, **kw: object) -> TrafficPlan:
    """Light, even load: few workers, each pausing between requests."""
    return TrafficPlan(requests=requests, concurrency=concurrency, interval_s=interval_s, **kw)  # type: ignore[arg-type]


def burst(requests: int = 12, **kw: object) -> TrafficPlan:
    """Everything at once: one worker per request, no pauses."""
    return TrafficPlan(requests=requests, concurrency=requests, interval_s=0.0, **kw)  # type: ignore[arg-type]


def mixed(
    requests: int = 20, long_prompt_tokens: int = 1000, long_every: int = 4, **kw: object
) -> TrafficPlan:
    """Long prompts among short ones (the prefill head-of-line blocking shape)."""
    return TrafficPlan(
        requests=requests, long_prompt_tokens=long_prompt_tokens, long_every=long_every, **kw  # type: ignore[arg-type]
    )


@dataclass
class TrafficResult:
    """What the client saw; token counts come from each response's `usage` field."""

    sent: int = 0
    # each outcome's count beside what the client kept of it
    ok: int = 0
    latencies_s: list[float] = field(default_factory=list)  # of successful requests, in completion order
    failed: int = 0
    errors: list[str] = field(default_factory=list)  # the first few failure reasons, one line each
    # as the server counted them, from each response's usage
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0


def make_prompt(n_words: int, index: int, seed: int = 0) -> str:
    """A prompt of `n_words` words, different per request index so prefix caching cannot merge them.

    >>> make_prompt(3, 0) == make_prompt(3, 0) != make_prompt(3, 1)
    True
    """
    rng = random.Random(seed * 1_000_003 + index)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def completions_body(model: str, plan: TrafficPlan, index: int) -> dict[str, object]:
    """The JSON body of request `index`."""
    return {
        "model": model,
        "prompt": make_prompt(plan.prompt_tokens_for(index), index, plan.seed),
        "max_tokens": plan.max_tokens,
        "temperature": 0.0,
        "ignore_eos": plan.ignore_eos,
        "stream": False,
    }


class _Run:
    """Shared state of one traffic run: the next request index, the deadline, the tallies."""

    def __init__(self, base_url: str, model: str, plan: TrafficPlan) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise TrafficError(f"base_url must look like http://127.0.0.1:8000, got {base_url!r}")
        self.host = parsed.hostname
        self.port = parsed.port or 80
        self.path = parsed.path.rstrip("/") + "/v1/completions"
        self.model = model
        self.plan = plan
        self.limit = plan.requests if plan.requests is not None else MAX_REQUESTS
        self.started = time.monotonic()
        self.deadline = self.started + plan.duration_s if plan.duration_s is not None else None
        self.lock = threading.Lock()
        self.next_index = 0
        self.stopped = False
        self.result = TrafficResult()

    def take_index(self) -> int | None:
        """Claim the next request index, or None when the count or the deadline is reached, or after stop()."""
        with self.lock:
            if self.stopped or self.next_index >= self.limit:
                return None
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return None
            index = self.next_index
            self.next_index += 1
            self.result.sent += 1
            return index

    def record_ok(self, usage: dict[str, object], latency_s: float) -> None:
        with self.lock:
            self.result.ok += 1
            self.result.prompt_tokens += int(usage.get("prompt_tokens", 0) or 0)  # type: ignore[arg-type]
            self.result.completion_tokens += int(usage.get("completion_tokens", 0) or 0)  # type: ignore[arg-type]
            self.result.latencies_s.append(latency_s)

    def record_failure(self, reason: str) -> None:
        with self.lock:
            self.result.failed += 1
            if len(self.result.errors) < _MAX_ERRORS_KEPT:
                self.result.errors.append(reason)

    def stop(self) -> None:
        """Start no new request; those in flight finish."""
        with self.lock:
            self.stopped = True

    def snapshot(self) -> TrafficResult:
        """The tallies so far (a copy: workers keep adding to the original)."""
        with self.lock:
            r = self.result
            return replace(r, latencies_s=list(r.latencies_s), errors=list(r.errors),
                           elapsed_s=time.monotonic() - self.started)

    def drive(self) -> TrafficResult:
        """Run the workers to the end of the plan (or stop()) and return the tallies."""
        self.started = time.monotonic()  # the plan's duration counts from here, not from construction
        self.deadline = self.started + self.plan.duration_s if self.plan.duration_s is not None else None
        n_workers = min(self.plan.concurrency, self.limit)
        threads = [threading.Thread(target=_worker, args=(self,), daemon=True, name=f"traffic-{i}")
                   for i in range(n_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.result.elapsed_s = time.monotonic() - self.started
        return self.result

    def sleep_between(self) -> None:
        """The steady pattern's pause, cut short at the deadline."""
        pause = self.plan.interval_s
        if pause <= 0:
            return
        if self.deadline is not None:
            pause = min(pause, max(0.0, self.deadline - time.monotonic()))
        time.sleep(pause)


def _one_request(run: _Run, conn: http.client.HTTPConnection, index: int) -> bool:
    """Send request `index` on `conn` and record the outcome; False when the connection must be replaced."""
    body = json.dumps(completions_body(run.model, run.plan, index)).encode()
    t0 = time.monotonic()
    try:
        try:
            conn.request("POST", run.path, body=body, headers={"Content-Type": "application/json"})
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # the server closed an idle keep-alive connection: the request never left; resend once, fresh
            conn.close()
            conn.request("POST", run.path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        run.record_failure(f"request {index}: {type(exc).__name__}: {exc}")
        return False
    latency = time.monotonic() - t0
    if resp.status != 200:
        snippet = data[:200].decode("utf-8", errors="replace").replace("\n", " ")
        run.record_failure(f"request {index}: HTTP {resp.status}: {snippet}")
        return True
    try:
        usage = json.loads(data)["usage"]
        if not isinstance(usage, dict):
            raise TypeError("usage is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        run.record_failure(f"request {index}: response without usage ({exc})")
        return True
    run.record_ok(usage, latency)
    return True


def _worker(run: _Run) -> None:
    """Claim and send requests until the plan's count or deadline is reached."""
    conn: http.client.HTTPConnection | None = None
    try:
        while (index := run.take_index()) is not None:
            if conn is None:
                conn = http.client.HTTPConnection(run.host, run.port, timeout=run.plan.request_timeout_s)
            if not _one_request(run, conn, index):
                conn.close()
                conn = None
            run.sleep_between()
    finally:
        if conn is not None:
            conn.close()


def run_traffic(base_url: str, model: str, plan: TrafficPlan | None = None, **overrides: object) -> TrafficResult:
    """Send the plan's requests to `base_url` (e.g. http://127.0.0.1:8000) and return the tallies.

    Blocks until done; ends by itself after `plan.requests` requests or `plan.duration_s` seconds
    (plus at most one request timeout for requests already in flight).
    """
    plan = replace(plan or TrafficPlan(), **overrides)  # type: ignore[arg-type]
    plan.validate()
    return _Run(base_url, model, plan).drive()


class BackgroundTraffic:
    """Run a traffic plan in a background thread (for a sidecar to scrape meanwhile); join with wait()."""

    def __init__(self, base_url: str, model: str, plan: TrafficPlan) -> None:
        plan.validate()
        self._run = _Run(base_url, model, plan)
        self._result: TrafficResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="traffic-main")

    def _main(self) -> None:
        try:
            self._result = self._run.drive()
        except BaseException as exc:  # handed to the caller in wait()
            self._error = exc

    def start(self) -> BackgroundTraffic:
        """Begin sending; returns immediately."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Send no new request; wait() then returns once those in flight have finished."""
        self._run.stop()

    def progress(self) -> TrafficResult:
        """What the client has seen so far, while the run goes on."""
        return self._run.snapshot()

    def done(self) -> bool:
        """True once the run has finished."""
        return not self._thread.is_alive()

    def wait(self, timeout_s: float | None = None) -> TrafficResult:
        """Block until the run ends (or raise TimeoutError after `timeout_s`) and return its result."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"traffic still running after {timeout_s} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
