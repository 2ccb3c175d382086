"""Stack captures in the store: taken when an incident opens (rate-limited, off the writer thread),
on demand (`vllm-sentinel capture`), and summarised as the incident's `profile` in diagnose."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from vllm_sentinel.agent.store import Store
from vllm_sentinel.collectors.frames import summarize
from vllm_sentinel.collectors.pyspy import PySpy, RateLimiter, TargetCapture, capture_target

log = logging.getLogger("vllm_sentinel.captures")

# incidents whose proof is "where is it stuck / what is it busy with": stacks say more than gauges
CAPTURE_ON = {"engine_stall", "frontend_cpu_bound", "queue_blocking", "prefill_hol_blocking", "underbatched"}
_COLUMNS = ("capture_id", "ts", "instance", "incident_id", "pid", "role", "kind", "status", "error", "duration_ms",
            "samples", "folded", "idle_included", "process_state", "artifact")


def save(store: Store, taken: TargetCapture) -> int:
    """Store the captures (and their timeline events) of one target; returns how many were stored."""
    con = store.cursor()  # appends to other tables never conflict with the writer thread's ticks
    rows = [c.to_row() for c in taken.captures]
    con.execute("BEGIN TRANSACTION")
    try:
        for row in rows:
            con.execute(f"INSERT INTO captures ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                        [row[c] for c in _COLUMNS])
        for e in taken.events():
            con.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", [e.ts_ms, e.instance, e.kind, e.labels, e.message])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def profile_of(store: Store, incident_id: str, top: int = 5) -> dict | None:
    """The diagnose contract's `profile` for an incident: hot frames of its captures, per process."""
    rows = store.cursor().execute(
        "SELECT pid, role, folded, process_state FROM captures WHERE incident_id = ? AND folded IS NOT NULL "
        "ORDER BY ts, role, pid", [incident_id]).fetchall()
    if not rows:
        return None
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
    return {"kind": "py-spy", "top_frames": frames[:top * 2], "processes": processes}


class IncidentCapturer:
    """After each evaluation, capture the stacks of targets whose incidents just opened."""

    def __init__(self, processes_of: dict[str, object], spy: PySpy | None = None,
                 limiter: RateLimiter | None = None, kinds: set[str] = CAPTURE_ON):
        self.processes_of = processes_of  # instance -> its ProcessCollector (holds the last discovery)
        self.spy = spy or PySpy()
        self.limiter = limiter or RateLimiter()
        self.kinds = kinds
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture")
        self.last_status: dict[str, str] = {}  # instance -> the last capture's status line

    def after_evaluation(self, store: Store, result: dict, incidents_by_id: dict[str, dict]) -> None:
        """Queue captures for opened incidents of the kinds stacks explain."""
        for iid in result.get("opened", []):
            inc = incidents_by_id.get(iid)
            if not inc or inc.get("incident") not in self.kinds:
                continue
            proc = self.processes_of.get(inc.get("instance"))
            if proc is None:
                continue
            self._pool.submit(self._capture, store, proc, iid)

    def _capture(self, store: Store, proc, incident_id: str) -> None:
        try:
            taken = capture_target(proc.target, self.spy, list(proc.processes), instance=proc.instance,
                                   incident_id=incident_id, limiter=self.limiter)
            self.last_status[proc.instance] = f"{taken.status}: {taken.error}" if taken.error else taken.status
            if taken.status != "rate_limited":
                save(store, taken)
        except Exception:
            log.exception("capture for %s failed; the daemon keeps running", incident_id)

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


def capture_and_store(store: Store | None, target: str, kind: str = "dump", duration_s: int = 3) -> dict:
    """Capture the target's vLLM processes now; store them when a store is given; return the summary."""
    from vllm_sentinel.collectors.pyspy import capture_now
    taken = capture_now(target, kind=kind, duration_s=duration_s)
    summary = capture_summary(taken)
    summary["stored"] = save(store, taken) if store is not None and taken.captures else 0
    return summary
