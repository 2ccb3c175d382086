"""Stack captures in the store: taken when an incident opens (rate-limited, off the writer thread),
on demand (`vllm-sentinel capture`), and summarised as the incident's `profile` in diagnose.

vLLM's own profiler (torch traces, or nsys under `nsys launch`) is opt-in: it slows serving while it
runs, so it is rate-limited far harder than py-spy and its rows record where the trace went."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from vllm_sentinel.agent.store.captures_table import captures_of_kinds, folded_stacks_of, insert_captures
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.frames import summarize
from vllm_sentinel.collectors.process import ProcessDiscoveryError, discover
from vllm_sentinel.collectors.profiler import PROFILER_KINDS, ProfileCapture, VllmProfiler
from vllm_sentinel.collectors.pyspy import PySpy, RateLimiter, TargetCapture, capture_now, capture_target

log = logging.getLogger("vllm_sentinel.captures")

# incidents whose proof is "where is it stuck / what is it busy with": stacks say more than gauges
CAPTURE_ON = {"engine_stall", "frontend_cpu_bound", "queue_blocking", "prefill_hol_blocking", "underbatched"}
# vLLM's profiler slows every request while it runs: one trace per target per 10 minutes, one per incident.
# Not for a stall: a frozen engine cannot start its profiler, and the request would hang until its timeout.
PROFILER_PER_TARGET_S = 600.0
PROFILE_ON = CAPTURE_ON - {"engine_stall"}
# captured even while the daemon is over its CPU budget: a frozen engine leaves its cores idle, and its
# stacks exist only until it resumes (a deferred capture would show a running engine)
NEVER_DEFERRED = {"engine_stall"}
MAX_DEFERRED = 16  # captures waiting for CPU budget; older ones are dropped (their moment has passed)


def save(store: Store, taken: TargetCapture) -> int:
    """Store the captures (and their timeline events) of one target; returns how many were stored."""
    return insert_captures(store, [c.to_row() for c in taken.captures], taken.events())


def save_profile(store: Store, cap: ProfileCapture) -> None:
    """Store one vLLM profiler capture (where its trace went, or why none was taken) and its event."""
    insert_captures(store, [cap.to_row()], [cap.to_event()])


def traces_of(store: Store, incident_id: str) -> list[dict]:
    """The vLLM profiler captures linked to an incident: kind, status, where the trace went, or why not."""
    out = []
    for ts, kind, status, error, duration_ms, artifact in captures_of_kinds(store, incident_id, PROFILER_KINDS):
        trace = {"ts": ts, "kind": kind, "status": status, "error": error, "duration_ms": duration_ms,
                 "artifact": artifact, "files": []}
        if artifact and artifact.startswith("{"):  # {"dir": ..., "files": [...]} when the files were seen
            try:
                found = json.loads(artifact)
                trace["artifact"], trace["files"] = found.get("dir"), list(found.get("files") or [])
            except ValueError:
                pass
        out.append(trace)
    return out


def profile_of(store: Store, incident_id: str, top: int = 5) -> dict | None:
    """The diagnose contract's `profile` for an incident: hot frames of its captures, per process."""
    rows = folded_stacks_of(store, incident_id)
    traces = traces_of(store, incident_id)
    if not rows:
        return {"kind": traces[0]["kind"], "top_frames": [], "processes": [], "traces": traces} if traces else None
    processes, frames = [], []
    for pid, role, folded, state in rows:
        stacks = {}
        for line in folded.splitlines():
            stack, _, n = line.rpartition(" ")
            stacks[stack] = stacks.get(stack, 0) + int(n)
        prof = summarize(stacks, pid, role, top).to_dict()
        prof["stopped"] = state in ("T", "t")
        processes.append(prof)
        frames += [f"{role}: {f['frame']}" for f in prof["top_frames"][:2]]
    doc = {"kind": "py-spy", "top_frames": frames[:top * 2], "processes": processes}
    if traces:
        doc["traces"] = traces
    return doc


class IncidentCapturer:
    """After each evaluation, capture the stacks of targets whose incidents just opened."""

    def __init__(self, processes_of: dict[str, object], spy: PySpy | None = None,
                 limiter: RateLimiter | None = None, kinds: set[str] = CAPTURE_ON,
                 profiler_s: float | None = None, profiler_limiter: RateLimiter | None = None,
                 make_profiler: Callable[..., VllmProfiler] = VllmProfiler,
                 gate: Callable[[str, bool], bool] | None = None):
        # gate(work, retry): False while the daemon is over its CPU budget; refused captures wait in
        # _deferred (bounded) and go first at a later evaluation
        self.gate = gate
        self._deferred: list[tuple[object, str, str | None]] = []
        self.processes_of = processes_of  # instance -> its ProcessCollector (holds the last discovery)
        self.spy = spy or PySpy()
        self.limiter = limiter or RateLimiter()
        self.kinds = kinds
        self.profiler_s = profiler_s  # None: vLLM's profiler is never triggered (the default)
        self.profiler_limiter = profiler_limiter or RateLimiter(per_target_s=PROFILER_PER_TARGET_S, per_incident=1)
        self.make_profiler = make_profiler
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture")
        self.last_status: dict[str, str] = {}  # instance -> the last capture's status line

    def after_evaluation(self, store: Store, result: dict, incidents_by_id: dict[str, dict]) -> None:
        """Queue captures for opened incidents of the kinds stacks explain (deferred ones first, when allowed)."""
        while self._deferred and self.gate is not None and self.gate("capture", True):
            self._pool.submit(self._capture, store, *self._deferred.pop(0))
        for iid in result.get("opened", []):
            inc = incidents_by_id.get(iid)
            if not inc or inc.get("incident") not in self.kinds:
                continue
            proc = self.processes_of.get(inc.get("instance"))
            if proc is None:
                continue
            if inc.get("incident") not in NEVER_DEFERRED and self.gate is not None and not self.gate("capture", False):
                self.last_status[proc.instance] = "deferred: the daemon is over its --cpu-budget"
                self._deferred = (self._deferred + [(proc, iid, inc.get("incident"))])[-MAX_DEFERRED:]
                continue
            self._pool.submit(self._capture, store, proc, iid, inc.get("incident"))

    def _capture(self, store: Store, proc, incident_id: str, kind: str | None = None) -> None:
        try:
            taken = capture_target(proc.target, self.spy, list(proc.processes), instance=proc.instance,
                                   incident_id=incident_id, limiter=self.limiter, reason=kind)
            self.last_status[proc.instance] = f"{taken.status}: {taken.error}" if taken.error else taken.status
            if taken.status != "rate_limited":
                save(store, taken)
        except Exception:
            log.exception("capture for %s failed; the daemon keeps running", incident_id)
        if self.profiler_s and kind in PROFILE_ON:  # after py-spy, whose stacks show the incident unslowed
            if self.gate is not None and not self.gate("profiler", False):
                self.last_status[proc.instance + " profiler"] = "skipped: the daemon is over its --cpu-budget"
                return
            try:
                self._profile(store, proc, incident_id)
            except Exception:
                log.exception("vLLM profiler capture for %s failed; the daemon keeps running", incident_id)

    def _profile(self, store: Store, proc, incident_id: str) -> None:
        why = self.profiler_limiter.check(proc.instance, incident_id)
        if why is not None:
            self.last_status[proc.instance + " profiler"] = f"rate_limited: {why}"
            return
        self.profiler_limiter.take(proc.instance, incident_id)
        profiler = self.make_profiler(proc.target, proc.instance, enabled=True, processes=list(proc.processes))
        cap = profiler.capture(self.profiler_s, incident_id=incident_id)
        self.last_status[proc.instance + " profiler"] = f"{cap.status}: {cap.error}" if cap.error else cap.status
        save_profile(store, cap)

    def close(self) -> None:
        """Finish captures in flight (before the store closes)."""
        self._pool.shutdown(wait=True)


def capture_summary(taken: TargetCapture, top: int = 8) -> dict:
    """What `vllm-sentinel capture` shows: per process its status, classes and hot frames."""
    procs = []
    for c in taken.captures:
        entry = {"pid": c.pid, "role": c.role, "status": c.status, "error": c.error, "stopped": c.stopped,
                 "capture_id": c.capture_id}
        if c.ok:
            entry.update(c.profile(top).to_dict())
        procs.append(entry)
    return {"target": taken.target, "instance": taken.instance, "status": taken.status, "error": taken.error,
            "processes": procs}


def capture_and_store(store: Store | None, target: str, kind: str = "dump", duration_s: int = 3,
                      profiler_s: float | None = None) -> dict:
    """Capture the target's vLLM processes now (and vLLM's profiler when `profiler_s`); store them when a
    store is given; return the summary."""
    taken = capture_now(target, kind=kind, duration_s=duration_s)
    summary = capture_summary(taken)
    summary["stored"] = save(store, taken) if store is not None and taken.captures else 0
    if profiler_s:
        try:
            processes = discover(target)
        except ProcessDiscoveryError:
            processes = []  # the profiler needs only the URL; without argv it assumes vLLM's torch profiler
        cap = VllmProfiler(target, taken.instance, enabled=True, processes=processes).capture(profiler_s)
        summary["profiler"] = {"kind": cap.kind, "status": cap.status, "error": cap.error, "artifact": cap.artifact,
                               "files": cap.files, "duration_ms": cap.duration_ms}
        if store is not None:
            save_profile(store, cap)
            summary["stored"] += 1
    return summary
