"""Find the vLLM processes behind a target (API server, EngineCore, Workers) and sample their CPU and memory.

Everything is read from /proc (`proc_root` is injectable, so tests hand it a recorded tree): the
listening socket of the target's port in /proc/net/tcp{,6} -> its inode -> the pids holding it in
/proc/PID/fd -> their descendants, each given a role from the process title vLLM sets
(`VLLM::EngineCore`, `VLLM::Worker_TP0`, `VLLM::APIServer_0`; the prefix is VLLM_PROCESS_NAME_PREFIX).

Series (names carry the sidecar's prefix because vLLM's own /metrics already exposes an unlabelled
`process_cpu_seconds_total` for the API server, which a `sum()` would otherwise double count):
  vllm_sentinel_process_cpu_seconds_total{role,pid}   counter, user+system CPU seconds
  vllm_sentinel_process_resident_memory_bytes{role,pid}
  vllm_sentinel_process_threads{role,pid}
  vllm_sentinel_process_start_time_seconds{role,pid}  a change means the process was restarted
  vllm_sentinel_process_stopped{role,pid}     1 while the process is stopped (state T or t: SIGSTOP, a tracer)
  vllm_sentinel_server_client_connections     established client TCP connections to the target's port, not
                                              counting the sidecar's own (its /metrics scrape): requests
                                              in flight that vLLM's gauges may not show yet
"""

from __future__ import annotations

import functools
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from .argv import parse_vllm_argv
from .base import Batch, CollectorStatus, Event
from .host_sockets import HostSockets, TcpTable, parent_map, socket_holders, stat_fields

ROLE_API_SERVER = "api_server"
ROLE_ENGINE_CORE = "engine_core"
ROLE_WORKER = "worker"
ROLE_DP_COORDINATOR = "dp_coordinator"
ROLE_OTHER = "other"

_STOPPED_STATES = ("T", "t")  # stopped by a signal (SIGSTOP, SIGTSTP), or by a tracer
# `PREFIX::Name[_suffix]`; comm is cut at 15 characters ("VLLM::EngineCor"), so match prefixes of names
_TITLE = re.compile(r"^[A-Za-z0-9_.-]*::(?P<name>[A-Za-z]+)")


@dataclass
class VllmProcess:
    """One process of a vLLM server: its role, title and command line (argv; empty if unreadable)."""

    pid: int
    ppid: int
    role: str
    title: str
    argv: list[str] = field(default_factory=list)

    def flags(self) -> dict[str, str]:
        """The long options of its command line, as vLLM reads them (see argv.parse_vllm_argv)."""
        return parse_vllm_argv(self.argv)


@dataclass
class ProcessUsage:
    """Resource use of one process at one instant, read from /proc/PID/stat and statm."""

    cpu_seconds: float
    rss_bytes: int
    threads: int
    start_time_s: float
    state: str = ""  # the state letter of the same read ('R', 'S', 'T' stopped, ...)


class ProcessDiscoveryError(RuntimeError):
    """The target's processes could not be found; the message names the cause and the fix."""


def target_port(target: str) -> int:
    """Port of a target URL or host:port: 'http://127.0.0.1:8000/metrics' -> 8000, 'h:9000' -> 9000."""
    parsed = urllib.parse.urlsplit(target if "://" in target else f"http://{target}")
    if parsed.port is not None:
        return parsed.port
    return 443 if parsed.scheme == "https" else 80


def role_from_title(title: str) -> str | None:
    """Role of a process from its vLLM title: 'VLLM::EngineCore_DP0' -> 'engine_core'; None if not a vLLM title."""
    m = _TITLE.match(title)
    if not m:
        return None
    name = m.group("name")
    for prefix, role in (("EngineCor", ROLE_ENGINE_CORE), ("Worker", ROLE_WORKER),
                         ("APIServer", ROLE_API_SERVER), ("DPCoordina", ROLE_DP_COORDINATOR)):
        if name.startswith(prefix):
            return role
    return ROLE_OTHER


def listening_inodes(port: int, proc_root: str | Path = "/proc") -> set[int]:
    """Socket inodes listening on TCP `port` (any address, IPv4 or IPv6) in this network namespace."""
    return set(TcpTable.read(proc_root).listening.get(port, ()))


def pids_holding(inodes: set[int], proc_root: str | Path = "/proc",
                 sockets: HostSockets | None = None) -> tuple[list[int], int]:
    """Pids with an open fd on one of the socket inodes, and how many /proc/PID/fd dirs were unreadable."""
    found, unreadable = sockets.holders() if sockets is not None else socket_holders(proc_root)
    return sorted({pid for inode in inodes for pid in found.get(inode, ())}), unreadable


def read_title(pid: int, proc_root: str | Path = "/proc") -> tuple[str, list[str]]:
    """(title, argv) of a process: the title is argv[0] as setproctitle left it, else comm."""
    base = Path(proc_root) / str(pid)
    argv: list[str] = []
    try:
        raw = (base / "cmdline").read_bytes()
        # setproctitle pads the old argv area with NULs: drop the empty tail
        argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0")]
        while argv and argv[-1] == "":
            argv.pop()
    except OSError:
        pass
    try:
        comm = (base / "comm").read_text().strip()
    except OSError:
        comm = ""
    for candidate in (argv[0] if argv else "", comm):
        if role_from_title(candidate) is not None:
            return candidate, argv  # argv[0] keeps the full title that comm cuts at 15 characters
    return comm or (os.path.basename(argv[0]) if argv else ""), argv


def discover(target: str, proc_root: str | Path = "/proc", sockets: HostSockets | None = None) -> list[VllmProcess]:
    """The vLLM processes serving `target` (URL or host:port), API servers first; raise ProcessDiscoveryError.

    The processes holding the listening socket whose parent does not hold it are the roots (the API
    server; with --api-server-count > 1 the launcher); their descendants with a vLLM title are the
    engine cores, workers, API-server replicas and the DP coordinator. `sockets`, when given, is the
    host's socket tables shared with other targets' collectors (read at most once per moment).
    """
    port = target_port(target)
    table = sockets.tcp()[0] if sockets is not None else TcpTable.read(proc_root)
    inodes = set(table.listening.get(port, ()))
    if not inodes:
        raise ProcessDiscoveryError(
            f"nothing listens on TCP port {port} in this network namespace ({proc_root}/net/tcp, tcp6): "
            "run the sidecar beside vLLM (same host, or the same Kubernetes pod) and check --target")
    holders, unreadable = pids_holding(inodes, proc_root, sockets)
    if not holders:
        hint = (f" ({unreadable} processes' fd tables were unreadable: run the sidecar as root or as "
                "vLLM's user)") if unreadable else ""
        raise ProcessDiscoveryError(
            f"port {port} is listening but no visible process holds its socket{hint}; the sidecar must "
            "share vLLM's PID namespace (Kubernetes: shareProcessNamespace: true; docker: --pid=container:NAME)")
    parents = sockets.parents() if sockets is not None else parent_map(proc_root)
    held = set(holders)
    roots = [p for p in holders if parents.get(p) not in held]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: list[VllmProcess] = []
    seen: set[int] = set()
    stack = list(reversed(roots))
    while stack:
        pid = stack.pop()
        if pid in seen or pid not in parents:
            continue
        seen.add(pid)
        title, argv = read_title(pid, proc_root)
        role = role_from_title(title)
        if pid in roots and role in (None, ROLE_OTHER):
            role = ROLE_API_SERVER  # the listener itself is the (untitled) API server
        if role is not None and role != ROLE_OTHER:
            found.append(VllmProcess(pid=pid, ppid=parents.get(pid, 0), role=role, title=title, argv=argv))
        stack.extend(sorted(children.get(pid, []), reverse=True))
    order = {ROLE_API_SERVER: 0, ROLE_DP_COORDINATOR: 1, ROLE_ENGINE_CORE: 2, ROLE_WORKER: 3}
    found.sort(key=lambda p: (order.get(p.role, 9), p.pid))
    return found


def read_usage(pid: int, proc_root: str | Path = "/proc") -> ProcessUsage | None:
    """CPU seconds, RSS, threads and start time of a process; None if it has exited."""
    fields = stat_fields(pid, proc_root)
    if fields is None:
        return None
    try:
        statm = (Path(proc_root) / str(pid) / "statm").read_text().split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # fields[0] is the state (field 3 of stat); utime/stime are fields 14/15, num_threads 20, starttime 22
    utime, stime = int(fields[11]), int(fields[12])
    return ProcessUsage(
        cpu_seconds=(utime + stime) / ticks,
        rss_bytes=int(statm[1]) * os.sysconf("SC_PAGE_SIZE"),
        threads=int(fields[17]),
        start_time_s=_boot_time(str(proc_root)) + int(fields[19]) / ticks,
        state=fields[0],
    )


def read_state(pid: int, proc_root: str | Path = "/proc") -> str | None:
    """The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, ...); None if the process has exited."""
    fields = stat_fields(pid, proc_root)
    return fields[0] if fields else None


def client_connections(port: int, exclude_inodes: set[int] = frozenset(), proc_root: str | Path = "/proc") -> int:
    """Established TCP connections to local `port` whose client end is not one of `exclude_inodes` (TcpTable.clients).

    (server rows 127.0.0.1:8000<-127.0.0.1:50000 and <-:50001, the sidecar holding :50001) -> 1.
    """
    return TcpTable.read(proc_root).clients(port, exclude_inodes)


REDISCOVER_S = 30.0  # a full /proc scan at least this often, for children that appeared meanwhile


class ProcessCollector:
    """Collector: discovers the target's vLLM processes and records their CPU and memory.

    Discovery scans every process's fd table, so its answer is kept while every process it found
    is still alive (same start time, not a zombie) and for at most `rediscover_s`: a restarted
    server, whose processes are new, is found again at the next run.
    """

    name = "process"

    def __init__(self, target: str, instance: str | None = None, proc_root: str | Path = "/proc",
                 rediscover_s: float = REDISCOVER_S, sockets: HostSockets | None = None) -> None:
        self.target = target
        # the host's socket tables, shared by every target's collector (each reads its own when not given)
        self.sockets = sockets if sockets is not None else HostSockets(proc_root, max_age_s=0.0)
        self.instance = instance or instance_of(target)
        self.proc_root = proc_root
        self.rediscover_ms = int(rediscover_s * 1000)
        self.processes: list[VllmProcess] = []  # last discovery, for py-spy and the config reader
        self._discovered_ms: int | None = None
        self._starts: dict[int, str] = {}  # pid -> start time (stat field 22) when discovered

    def _discover(self, now_ms: int) -> list[VllmProcess]:
        """The last discovery while it still holds, else a new one (raises ProcessDiscoveryError)."""
        if self._discovered_ms is not None and 0 <= now_ms - self._discovered_ms < self.rediscover_ms \
                and all(self._start_of(pid) == start for pid, start in self._starts.items()):
            return self.processes
        self._discovered_ms = None
        found = discover(self.target, self.proc_root, self.sockets)
        self._starts = {p.pid: self._start_of(p.pid) for p in found}
        # one that exited meanwhile: not kept, so the next run looks again
        self._discovered_ms = now_ms if None not in self._starts.values() else None
        return found

    def _start_of(self, pid: int) -> str | None:
        """A live process's start time (pid reuse shows as a change); None once it exited or is a zombie."""
        fields = stat_fields(pid, self.proc_root)
        return None if fields is None or fields[0] in ("Z", "X") else fields[19]

    def collect(self, now_ms: int) -> Batch:
        """Discover, sample, and return the series; a discovery failure is a status, not an exception."""
        batch = Batch(instance=self.instance, ts_ms=now_ms)
        try:
            found = self._discover(now_ms)
        except ProcessDiscoveryError as exc:
            batch.status = CollectorStatus(self.name, ok=False, error=str(exc))
            batch.events.extend(self._changes([], now_ms))
            self.processes = []
            return batch
        batch.events.extend(self._changes(found, now_ms))
        self.processes = found
        for proc in found:
            usage = read_usage(proc.pid, self.proc_root)
            if usage is None:
                continue  # exited between discovery and reading: the next run reports it
            labels = {"role": proc.role, "pid": str(proc.pid)}
            batch.add("vllm_sentinel_process_cpu_seconds_total", labels, usage.cpu_seconds)
            batch.add("vllm_sentinel_process_resident_memory_bytes", labels, float(usage.rss_bytes))
            batch.add("vllm_sentinel_process_threads", labels, float(usage.threads))
            batch.add("vllm_sentinel_process_start_time_seconds", labels, usage.start_time_s)
            batch.add("vllm_sentinel_process_stopped", labels, 1.0 if usage.state in _STOPPED_STATES else 0.0)
        if found:
            table, own = self.sockets.tcp()
            batch.add("vllm_sentinel_server_client_connections", {},
                      float(table.clients(target_port(self.target), own)))
        roles = sorted({p.role for p in found})
        batch.status = CollectorStatus(self.name, ok=True, detail={
            "processes": len(found), "roles": roles, "pids": [p.pid for p in found]})
        return batch

    def _changes(self, found: list[VllmProcess], now_ms: int) -> list[Event]:
        """Events for processes that appeared or vanished since the previous run (none on the first)."""
        if not self.processes and not found:
            return []
        before = {p.pid: p for p in self.processes}
        after = {p.pid: p for p in found}
        events = []
        if self.processes:  # the first discovery is not a change
            for pid in sorted(after.keys() - before.keys()):
                p = after[pid]
                events.append(Event(now_ms, self.instance, "process_started",
                                    {"role": p.role, "pid": str(pid)}, f"{p.title} (pid {pid}) appeared"))
        for pid in sorted(before.keys() - after.keys()):
            p = before[pid]
            events.append(Event(now_ms, self.instance, "process_exited",
                                {"role": p.role, "pid": str(pid)}, f"{p.title} (pid {pid}) is gone"))
        return events


def instance_of(target: str) -> str:
    """host:port of a target URL, as Prometheus' `instance` label."""
    parsed = urllib.parse.urlsplit(target if "://" in target else f"http://{target}")
    return f"{parsed.hostname}:{target_port(target)}"


@functools.lru_cache(maxsize=8)
def _boot_time(proc_root: str) -> float:
    """System boot time (seconds since the epoch) from /proc/stat's btime; 0 if unreadable.

    Read once per proc root: btime moves only with a reboot, and /proc/stat grows with the host's cores.
    """
    try:
        for line in (Path(proc_root) / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return 0.0
