"""Scenarios that make a real vLLM CPU server misbehave on purpose, one incident each.

Each scenario is a traffic pattern plus actions on the server (freeze its EngineCore, stop it),
run against a server started with `scenario_server_config()`; it returns when it is over, with the
times of its phases, so a caller (the integration tests, the demo, the recording script) can ask
`diagnose` about exactly that window. One server serves every scenario (startup costs 45-90 s on
2 cores): 8 KV blocks of 128 tokens and 4 sequences at most, so

* short requests (1 block each) at concurrency 12 queue behind the 4 running ones -> queue_blocking;
* 400-token requests (4 blocks each) at concurrency 12 need 16 blocks for 4 sequences, more than
  the 8 there are -> the scheduler preempts for real -> kv_cache_pressure;
* SIGSTOP of the EngineCore freezes the engine while the API server keeps answering /metrics with
  requests in flight and no token progress -> engine_stall (a short freeze of 15-20 s as well as a
  long one); the same freeze of an idle server has nothing in flight -> nothing may fire;
* stopping the server makes every scrape fail -> target_down (run it last: it ends the server);
* one short request at a time -> healthy, nothing may fire.

kv_fragmentation runs on a server of its own (`fragmentation_server_config`): 48 clients of ~16-token
requests hold one 128-token block each, so 7 of the 8 blocks (one is vLLM's null block) cap how many
run while --max-num-seqs 64 would allow more, and the rest wait.

Nothing here prints; `say` callbacks carry progress to whoever wants it.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vllm_sentinel.agent.demo.traffic import BackgroundTraffic, TrafficPlan, TrafficResult
from vllm_sentinel.agent.demo.vllm_server import VllmServer, VllmServerConfig, log_tail
from vllm_sentinel.collectors.base import now_ms
from vllm_sentinel.collectors.exposition import parse
from vllm_sentinel.collectors.process import (ROLE_ENGINE_CORE, ProcessDiscoveryError, discover, parent_map,
                                              read_state)

# One server for every scenario: 8 x 128 = 1024 KV tokens, 4 sequences at most (see the docstring).
SCENARIO_MAX_NUM_SEQS = 4
SCENARIO_NUM_GPU_BLOCKS = 8
SCENARIO_MAX_MODEL_LEN = 512
FRAGMENTATION_MAX_NUM_SEQS = 64  # well above the 7 requests the blocks admit: sequences are not the limit
FRAGMENTATION_CLIENTS = 48

# How long each scenario holds its condition by default, from the shipped rules (rules/*.yaml):
# queue_blocking and kv_cache_pressure fire `for: 1m` after their 2m-window signal crosses (10-20 s
# into the load); engine_stall fires 10 s after the last token (its window, `for: 0s`), held 60 s here
# to show a long stall stays one incident; target_down `for: 30s`; kv_fragmentation's outage rule
# `for: 1m` after its 1m window fills. Each hold leaves 15-25 s of margin for a busy host and the 5 s
# evaluation step.
DEFAULT_HOLD_S = {
    "healthy": 60.0,
    "queue_blocking": 105.0,
    "kv_cache_pressure": 105.0,
    "engine_stall": 60.0,
    "engine_stall_short": 18.0,
    "idle_freeze": 20.0,
    "kv_fragmentation": 100.0,  # labelled 66-71 s in (its 1m window, then `for: 1m`)
    "target_down": 50.0,
    "load_imbalance": 105.0,
}
# after the condition ends, the sidecar needs a scrape or two (1 s interval) before the window closes
SETTLE_S = 3.0
# how long engine_stall watches for a resumed engine's first counted token (its drain may be shorter)
RESUME_PROGRESS_WAIT_S = 60.0
# engine_stall's load runs until it is stopped after the resume; this bounds it should that never come
STALL_LOAD_BOUND_S = 900.0

Say = Callable[[str], None]


def _quiet(_message: str) -> None:
    """The default `say`: nothing (the library never prints)."""


class ScenarioError(RuntimeError):
    """A scenario could not do what it must (no EngineCore to freeze, server not running, ...)."""


@dataclass
class ScenarioRun:
    """What one scenario did and when: the window to diagnose is (start_ms, end_ms]."""

    name: str
    expected_incident: str | None  # the incident label it must produce; None: nothing may fire
    start_ms: int
    end_ms: int = 0
    phases: list[tuple[str, int]] = field(default_factory=list)  # (phase name, start ms), in order
    traffic: TrafficResult | None = None
    detail: dict[str, object] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Wall time of the scenario."""
        return (self.end_ms - self.start_ms) / 1000

    def phase(self, name: str) -> int:
        """Start time (ms) of phase `name`; KeyError if the scenario had none."""
        for n, t in self.phases:
            if n == name:
                return t
        raise KeyError(f"scenario {self.name} has no phase {name!r}; it has {[n for n, _ in self.phases]}")

    def mark(self, name: str) -> int:
        """Record that phase `name` starts now; returns the time."""
        t = now_ms()
        self.phases.append((name, t))
        return t

    def as_dict(self) -> dict[str, object]:
        """Plain data, for logs and the recording's README."""
        return {"name": self.name, "expected_incident": self.expected_incident, "start_ms": self.start_ms,
                "end_ms": self.end_ms, "seconds": round(self.seconds, 1), "phases": self.phases,
                "traffic": None if self.traffic is None else {
                    "ok": self.traffic.ok, "failed": self.traffic.failed,
                    "completion_tokens": self.traffic.completion_tokens},
                "detail": self.detail}


def fragmentation_server_config(model_dir: Path, **overrides: object) -> VllmServerConfig:
    """kv_fragmentation's server: CPU's default 128-token blocks, 8 of them, and room for 64 sequences."""
    kw: dict[str, object] = {"max_num_seqs": FRAGMENTATION_MAX_NUM_SEQS, "num_gpu_blocks_override": SCENARIO_NUM_GPU_BLOCKS,
                             "max_model_len": SCENARIO_MAX_MODEL_LEN,
                             "extra_env": {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "60"}}
    kw.update(overrides)
    return VllmServerConfig(model_dir=model_dir, **kw)  # type: ignore[arg-type]


def scenario_server_config(model_dir: Path, **overrides: object) -> VllmServerConfig:
    """The engine settings every scenario is tuned for (fields of VllmServerConfig may be overridden)."""
    kw: dict[str, object] = {"max_num_seqs": SCENARIO_MAX_NUM_SEQS,
                             "num_gpu_blocks_override": SCENARIO_NUM_GPU_BLOCKS,
                             "max_model_len": SCENARIO_MAX_MODEL_LEN,
                             # 32 queueing clients on a busy host lost 5-10% of requests to connections the
                             # server closed at its 5 s keep-alive; no incident depends on this setting
                             "extra_env": {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "60"}}
    kw.update(overrides)
    return VllmServerConfig(model_dir=model_dir, **kw)  # type: ignore[arg-type]


# -- traffic patterns --------------------------------------------------------------------------------

def healthy_plan(seconds: float) -> TrafficPlan:
    """One short request at a time with pauses: nothing waits, nothing is preempted."""
    return TrafficPlan(requests=None, duration_s=seconds, concurrency=1, prompt_tokens=16, max_tokens=16,
                       interval_s=1.0, seed=11)


def queue_plan(seconds: float) -> TrafficPlan:
    """32 clients of short requests (under 128 tokens: one KV block each) for 4 sequence slots.

    Each request waits for about (32 - 4) / 4 = 7 service times; at 12 clients the queue-time p95
    measured 1.5 s on a 2-core host, too close to the rule's 1 s for a faster machine.
    """
    return TrafficPlan(requests=None, duration_s=seconds, concurrency=32, prompt_tokens=12, max_tokens=100,
                       seed=12)


def kv_pressure_plan(seconds: float) -> TrafficPlan:
    """12 clients of ~400-token requests (200 prompt + 200 output: 4 blocks each) for 8 blocks."""
    return TrafficPlan(requests=None, duration_s=seconds, concurrency=12, prompt_tokens=200, max_tokens=200,
                       seed=13)


def stall_plan(seconds: float) -> TrafficPlan:
    """Two clients of long requests (32+300 tokens, 3 blocks each: both fit in the 7 blocks vLLM uses of
    8, one being its null block, so nobody is preempted), so requests are running when the engine freezes."""
    return TrafficPlan(requests=None, duration_s=seconds, concurrency=2, prompt_tokens=32, max_tokens=300,
                       seed=14, request_timeout_s=seconds + 120)


def fragmentation_plan(seconds: float) -> TrafficPlan:
    """48 clients of 16-token prompts and 16-token outputs: each request holds 32 of its block's 128 slots at most."""
    return TrafficPlan(requests=None, duration_s=seconds, concurrency=FRAGMENTATION_CLIENTS, prompt_tokens=16,
                       max_tokens=16, seed=15)


# -- processes -----------------------------------------------------------------------------------------

def find_engine_core(server: VllmServer, proc_root: str | Path = "/proc") -> int:
    """PID of the server's EngineCore process (title VLLM::EngineCore), found under its API server in /proc."""
    if not server.is_running():
        raise ScenarioError(f"the vLLM server at {server.url} is not running; start it before a scenario")
    try:
        procs = discover(server.url, proc_root)
    except ProcessDiscoveryError as e:
        raise ScenarioError(f"cannot find the processes of {server.url}: {e}") from e
    cores = [p for p in procs if p.role == ROLE_ENGINE_CORE and _is_descendant(p.pid, server.pid, proc_root)]
    if not cores:
        titles = ", ".join(f"{p.pid}:{p.title or p.role}" for p in procs) or "none"
        raise ScenarioError(f"no VLLM::EngineCore process under the API server (pid {server.pid}); found {titles}. "
                            "Is this a vLLM v1 server with multiprocessing on (VLLM_ENABLE_V1_MULTIPROCESSING=1)?")
    return cores[0].pid


def _is_descendant(pid: int, ancestor: int | None, proc_root: str | Path) -> bool:
    """True when `ancestor` is `pid`'s parent, grandparent, ... (bounded walk up /proc)."""
    if ancestor is None:
        return False
    parents = parent_map(proc_root)
    for _ in range(64):
        pid = parents.get(pid, 0)
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


# -- scenarios ------------------------------------------------------------------------------------------

def _load_scenario(name: str, expected: str | None, server: VllmServer, plan: TrafficPlan, say: Say) -> ScenarioRun:
    """Run `plan` to its end and wait for one more scrape: the shape of the traffic-only scenarios."""
    if not server.is_running():
        raise ScenarioError(f"the vLLM server at {server.url} is not running; start it before {name}")
    run = ScenarioRun(name, expected, now_ms())
    run.mark("load")
    say(f"{name}: {plan.concurrency} clients, {plan.prompt_tokens}+{plan.max_tokens} tokens, "
        f"{plan.duration_s:.0f} s")
    run.traffic = BackgroundTraffic(server.url, server.model_name, plan).start().wait(
        (plan.duration_s or 0) + plan.request_timeout_s + 30)
    run.mark("settle")
    time.sleep(SETTLE_S)
    run.end_ms = now_ms()
    return run


def healthy(server: VllmServer, seconds: float | None = None, say: Say = _quiet) -> ScenarioRun:
    """Light load for `seconds`: no incident may fire."""
    return _load_scenario("healthy", None, server, healthy_plan(seconds or DEFAULT_HOLD_S["healthy"]), say)


def queue_blocking(server: VllmServer, seconds: float | None = None, say: Say = _quiet) -> ScenarioRun:
    """Three times more clients than sequence slots for `seconds`: requests queue for seconds each."""
    return _load_scenario("queue_blocking", "queue_blocking", server,
                          queue_plan(seconds or DEFAULT_HOLD_S["queue_blocking"]), say)


def kv_cache_pressure(server: VllmServer, seconds: float | None = None, say: Say = _quiet) -> ScenarioRun:
    """Long requests that overflow the 8-block KV cache for `seconds`: real preemptions."""
    return _load_scenario("kv_cache_pressure", "kv_cache_pressure", server,
                          kv_pressure_plan(seconds or DEFAULT_HOLD_S["kv_cache_pressure"]), say)


SCHEDULER_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def engine_gauges(server: VllmServer, timeout_s: float = 5.0,
                  names: tuple[str, ...] = SCHEDULER_GAUGES) -> dict[str, float]:
    """vLLM's series `names` (the scheduler gauges by default) as the API server reports them now, summed
    over engines (0 when absent)."""
    with urllib.request.urlopen(server.metrics_url, timeout=timeout_s) as resp:  # noqa: S310 - loopback URL
        parsed = parse(resp.read().decode("utf-8", errors="replace"), strict=False)
    out = dict.fromkeys(names, 0.0)
    for name, value in zip(parsed.names, parsed.values):
        if name in out and value is not None:
            out[name] += value
    return out


def freeze_with_requests_running(server: VllmServer, pid: int, attempts: int = 40,
                                 wait_s: float = 60.0) -> tuple[dict[str, float], int]:
    """SIGSTOP `pid` at a moment the engine has reported running requests; return the gauges it froze with
    and the time (ms) of that SIGSTOP.

    vLLM's gauges change only when the engine reports a step, and requests sent to a frozen engine
    never reach its scheduler: a freeze that lands between two requests shows nothing in flight.
    So wait, with the engine running, until it reports a running request; then stop, and read the
    gauges the API server now holds for good. When the request finished just before the stop,
    resume and wait again (bounded). The engine is never held stopped while waiting: on a starved
    host, stop-read-resume in a loop froze it most of the time, a stall of its own before the real
    one (CI: two engine_stall incidents for one freeze). The process is left stopped on success,
    running on failure.
    """
    for _ in range(attempts):
        deadline = time.monotonic() + wait_s
        while engine_gauges(server)["vllm:num_requests_running"] <= 0:
            if time.monotonic() > deadline:
                raise ScenarioError(f"EngineCore pid {pid} reported no running request in {wait_s:.0f} s: is "
                                    f"traffic reaching {server.url}? (log {server.log_path})")
            time.sleep(0.2)
        os.kill(pid, signal.SIGSTOP)
        stopped_ms = now_ms()
        try:
            time.sleep(0.3)  # outputs the engine sent before the stop are still being processed
            gauges = engine_gauges(server)
        except BaseException:
            os.kill(pid, signal.SIGCONT)
            raise
        if gauges["vllm:num_requests_running"] > 0:
            return gauges, stopped_ms
        os.kill(pid, signal.SIGCONT)
    raise ScenarioError(f"EngineCore pid {pid}: each of {attempts} stops landed after its running requests "
                        f"finished (log {server.log_path})")


def engine_stall(server: VllmServer, seconds: float | None = None, say: Say = _quiet,
                 warmup_s: float = 4.0, drain_s: float = 10.0) -> ScenarioRun:
    """Freeze the EngineCore (SIGSTOP) with requests running for `seconds`, then SIGCONT it.

    The API server keeps answering /metrics, so the sidecar sees running requests and flat token
    counters. The engine is always resumed, even when the wait is interrupted. The load runs until
    `drain_s` after the resume, however long the freeze took to land (it is stopped, not timed out).
    """
    stall_s = seconds or DEFAULT_HOLD_S["engine_stall"]
    pid = find_engine_core(server)
    run = ScenarioRun("engine_stall", "engine_stall", now_ms(), detail={"engine_core_pid": pid})
    run.mark("load")
    say(f"engine_stall: traffic for {warmup_s:.0f} s, then SIGSTOP EngineCore pid {pid} for {stall_s:.0f} s")
    # the duration only bounds a run whose stop() never came; the freeze's own waits are shorter
    load = BackgroundTraffic(server.url, server.model_name, stall_plan(STALL_LOAD_BOUND_S)).start()
    try:
        time.sleep(warmup_s)
        try:
            gauges, stopped_ms = freeze_with_requests_running(server, pid)
        except ScenarioError as e:
            raise ScenarioError(f"{e}; the load so far: {traffic_summary(load.progress())}; the server's log "
                                f"ends: {log_tail(server.log_path, 3)!r}") from e
        try:
            run.phases.append(("stopped", stopped_ms))
            run.detail["frozen_with"] = gauges
            run.detail["state_while_stopped"] = read_state(pid)
            time.sleep(stall_s)
            before = tokens_counted(server)
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed_ms = run.mark("resumed")
        say("engine_stall: EngineCore resumed; draining requests in flight")
        if before is not None:
            run.detail["progress_after_resume_s"] = first_progress_s(server, before, resumed_ms, RESUME_PROGRESS_WAIT_S)
        time.sleep(max(0.0, drain_s - (now_ms() - resumed_ms) / 1000))
    finally:
        load.stop()
        run.traffic = load.wait(stall_s + 300)
    run.mark("settle")
    time.sleep(SETTLE_S)
    run.end_ms = now_ms()
    return run


def tokens_counted(server: VllmServer) -> float | None:
    """Prompt plus generated tokens the server has counted so far; None when its /metrics did not answer
    (a starved API server may miss one read)."""
    try:
        return sum(engine_gauges(server, names=TOKEN_COUNTERS).values())
    except OSError:
        return None


def first_progress_s(server: VllmServer, tokens_before: float, since_ms: int, within_s: float) -> float | None:
    """Seconds from `since_ms` until the server's token counters first exceed `tokens_before` (None if not
    within `within_s`): when a resumed engine's progress became visible to any scraper."""
    while (now_ms() - since_ms) / 1000 < within_s:
        now = tokens_counted(server)
        if now is not None and now > tokens_before:
            return round((now_ms() - since_ms) / 1000, 1)
        time.sleep(0.5)
    return None


def traffic_summary(t: TrafficResult) -> str:
    """One line of a traffic run's tallies: sent, ok, failed and the first failure."""
    first = f" (first: {t.errors[0]})" if t.errors else ""
    return f"{t.sent} sent in {t.elapsed_s:.0f} s, {t.ok} ok, {t.failed} failed{first}"


def idle_freeze(server: VllmServer, seconds: float | None = None, say: Say = _quiet) -> ScenarioRun:
    """SIGSTOP the EngineCore of an idle server (no traffic, nothing running) for `seconds`: nothing may fire."""
    freeze_s = seconds or DEFAULT_HOLD_S["idle_freeze"]
    pid = find_engine_core(server)
    run = ScenarioRun("idle_freeze", None, now_ms(), detail={"engine_core_pid": pid})
    gauges = engine_gauges(server)
    if gauges["vllm:num_requests_running"] or gauges["vllm:num_requests_waiting"]:
        raise ScenarioError(f"idle_freeze needs an idle server; {server.url} reports {gauges}")
    say(f"idle_freeze: SIGSTOP EngineCore pid {pid} of the idle server for {freeze_s:.0f} s")
    os.kill(pid, signal.SIGSTOP)
    try:
        run.mark("stopped")
        for _ in range(20):  # the stop lands when the process next runs: a busy host takes a moment
            if read_state(pid) == "T":
                break
            time.sleep(0.1)
        run.detail["state_while_stopped"] = read_state(pid)
        time.sleep(freeze_s)
    finally:
        os.kill(pid, signal.SIGCONT)
    run.mark("resumed")
    time.sleep(SETTLE_S)
    run.end_ms = now_ms()
    return run


def kv_fragmentation(server: VllmServer, seconds: float | None = None, say: Say = _quiet) -> ScenarioRun:
    """48 clients of short requests on `fragmentation_server_config`'s 8 blocks of 128: blocks, not sequences, run out."""
    return _load_scenario("kv_fragmentation", "kv_fragmentation", server,
                          fragmentation_plan(seconds or DEFAULT_HOLD_S["kv_fragmentation"]), say)


def target_down(server: VllmServer, seconds: float | None = None, say: Say = _quiet) -> ScenarioRun:
    """Stop the server and stay down for `seconds` (the server is not restarted: run this last)."""
    down_s = seconds or DEFAULT_HOLD_S["target_down"]
    if not server.is_running():
        raise ScenarioError(f"the vLLM server at {server.url} is not running; target_down needs one to stop")
    run = ScenarioRun("target_down", "target_down", now_ms())
    run.mark("stopping")
    say(f"target_down: stopping the server, then {down_s:.0f} s without it")
    run.detail["exit_code"] = server.stop()
    run.mark("down")
    time.sleep(down_s)
    run.end_ms = now_ms()
    return run


def load_imbalance(busy: VllmServer, idle: VllmServer, seconds: float | None = None,
                   say: Say = _quiet) -> ScenarioRun:
    """Two replicas of one model behind a bad router: the queueing load on `busy`, one client on `idle`.

    `busy` queues as in queue_blocking (32 clients for 4 slots) while `idle` serves one short request
    at a time, so one replica's queue could fit in the other's free slots -> load_imbalance (and
    queue_blocking on `busy`). Both servers must run the scenario settings and one served model name.
    """
    hold = seconds or DEFAULT_HOLD_S["load_imbalance"]
    for server in (busy, idle):
        if not server.is_running():
            raise ScenarioError(f"the vLLM server at {server.url} is not running; start both replicas first")
    if busy.model_name != idle.model_name:
        raise ScenarioError(f"replicas serve one model: {busy.model_name!r} and {idle.model_name!r} differ")
    run = ScenarioRun("load_imbalance", "load_imbalance", now_ms(), detail={"busy": busy.instance, "idle": idle.instance})
    run.mark("load")
    say(f"load_imbalance: 32 clients on {busy.instance}, 1 client on {idle.instance}, {hold:.0f} s")
    heavy = BackgroundTraffic(busy.url, busy.model_name, queue_plan(hold)).start()
    light = BackgroundTraffic(idle.url, idle.model_name, healthy_plan(hold)).start()
    limit = hold + queue_plan(hold).request_timeout_s + 30
    run.traffic = heavy.wait(limit)
    idle_traffic = light.wait(limit)
    run.detail["idle_traffic"] = {"ok": idle_traffic.ok, "failed": idle_traffic.failed}
    run.mark("settle")
    time.sleep(SETTLE_S)
    run.end_ms = now_ms()
    return run


ScenarioFn = Callable[..., ScenarioRun]

# in the order a shared server runs them: healthy first (a clean window), target_down last
SCENARIOS: dict[str, ScenarioFn] = {
    "healthy": healthy,
    "queue_blocking": queue_blocking,
    "kv_cache_pressure": kv_cache_pressure,
    "engine_stall": engine_stall,
    "idle_freeze": idle_freeze,
    "target_down": target_down,
}


def run_sequence(server: VllmServer, names: list[str], say: Say = _quiet,
                 seconds: dict[str, float] | None = None, gap_s: float = 0.0) -> list[ScenarioRun]:
    """Run scenarios one after another on one server (target_down, if asked, must be last)."""
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ScenarioError(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    if "target_down" in names[:-1]:
        raise ScenarioError("target_down stops the server: put it last")
    runs = []
    for i, name in enumerate(names):
        if i and gap_s > 0:
            time.sleep(gap_s)  # let rates of the previous scenario leave their windows
        runs.append(SCENARIOS[name](server, (seconds or {}).get(name), say=say))
    return runs
