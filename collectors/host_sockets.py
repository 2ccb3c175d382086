"""The host's TCP sockets, read from /proc once and shared by every target's process collector.

/proc/net/tcp lists every socket of the network namespace: on a busy host thousands of rows, most
of them TIME_WAIT. Parsing it per target on every run cost 11.5 ms of CPU per call with 664 rows.
Here one read is parsed once into what the collectors ask of it (listening sockets by port,
established connections by local port) and, through `HostSockets`, shared by all targets for a
moment (`max_age_s`), together with the sidecar's own sockets, the map from socket to the
processes holding it and the process tree (pid -> parent) that discovery needs.

Addresses stay as the kernel prints them until a row is looked at: only the rows of one port's
connections and the sidecar's own ends are decoded.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TCP_LISTEN = "0A"
TCP_ESTABLISHED = "01"


@dataclass
class TcpTable:
    """One parse of /proc/net/tcp and tcp6: listeners by port, established connections by local port."""

    listening: dict[int, set[int]] = field(default_factory=dict)  # port -> inodes of its listening sockets
    established: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # local port -> (local, remote)
    ends: dict[int, tuple[str, str]] = field(default_factory=dict)  # inode -> (local, remote) of established ones

    @classmethod
    def read(cls, proc_root: str | Path = "/proc") -> "TcpTable":
        """Both tables of proc_root's network namespace; an unreadable one counts as empty."""
        table = cls()
        for name in ("tcp", "tcp6"):
            try:
                text = (Path(proc_root) / "net" / name).read_text()
            except OSError:
                continue
            table._add(text)
        return table

    def _add(self, text: str) -> None:
        lines = text.splitlines()
        for line in lines[1:]:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            cols = line.split(None, 10)
            if len(cols) < 10:
                continue
            state = cols[3]
            if state != TCP_ESTABLISHED and state != TCP_LISTEN:
                continue  # TIME_WAIT and the rest: most rows of a busy host, of no use here
            local = cols[1]
            try:
                port, inode = int(local[local.rindex(":") + 1:], 16), int(cols[9])
            except ValueError:
                continue
            if state == TCP_LISTEN:
                if inode:
                    self.listening.setdefault(port, set()).add(inode)
                continue
            self.established.setdefault(port, []).append((local, cols[2]))
            if inode:
                self.ends[inode] = (local, cols[2])

    def clients(self, port: int, exclude_inodes: set[int] | frozenset[int] = frozenset()) -> int:
        """Established connections to local `port` whose client end is not one of `exclude_inodes`.

        The server's end of a connection is a row with local port `port`. When the client runs on
        this host its own end is a row too, with the addresses swapped; where that row's inode is
        one of `exclude_inodes` (the sidecar's sockets) the connection is the sidecar's own scrape.
        Addresses are compared decoded, IPv4-mapped IPv6 as IPv4: a dual-stack server sees an IPv4
        client as ::ffff:a.b.c.d.
        """
        rows = self.established.get(port, ())
        if not rows:
            return 0
        own = {(endpoint(e[0]), endpoint(e[1])) for e in (self.ends.get(i) for i in exclude_inodes) if e}
        if not own:
            return len(rows)
        return sum(1 for local, remote in rows if (endpoint(remote), endpoint(local)) not in own)


@functools.lru_cache(maxsize=8192)
def endpoint(text: str) -> tuple[str, int]:
    """'0100007F:1F40' -> ('127.0.0.1', 8000); the kernel prints each 32-bit word of the address in host order."""
    addr_hex, port_hex = text.rsplit(":", 1)
    raw = bytes.fromhex(addr_hex)
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port_hex, 16)


def all_pids(proc_root: str | Path) -> list[int]:
    """Numeric entries of proc_root."""
    try:
        return sorted(int(n) for n in os.listdir(proc_root) if n.isdigit())
    except OSError:
        return []


def stat_fields(pid: int, proc_root: str | Path) -> list[str] | None:
    """/proc/PID/stat fields after the comm (state first); comm may hold spaces and parentheses."""
    try:
        text = (Path(proc_root) / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def parent_map(proc_root: str | Path = "/proc") -> dict[int, int]:
    """pid -> ppid for every live process under proc_root (zombies are dead: left out)."""
    parents: dict[int, int] = {}
    for pid in all_pids(proc_root):
        fields = stat_fields(pid, proc_root)
        if fields is not None and fields[0] not in ("Z", "X"):
            parents[pid] = int(fields[1])
    return parents


def _socket_links(pid: int, proc_root: str | Path) -> list[int] | None:
    """Inodes of the sockets among /proc/PID/fd's links; None if the fd table is unreadable (PermissionError
    raised as is, so a caller can count it)."""
    fd_dir = Path(proc_root) / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except PermissionError:
        raise
    except OSError:
        return None  # exited meanwhile
    out = []
    for fd in names:
        try:
            link = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            out.append(int(link[8:-1]))
    return out


def socket_inodes(pid: int, proc_root: str | Path = "/proc") -> set[int]:
    """Inodes of the sockets process `pid` holds open ('socket:[123]' links in /proc/PID/fd); empty if unreadable."""
    try:
        return set(_socket_links(pid, proc_root) or ())
    except PermissionError:
        return set()


def socket_holders(proc_root: str | Path = "/proc") -> tuple[dict[int, list[int]], int]:
    """Socket inode -> pids holding it open, over every process; and how many fd tables were unreadable."""
    holders: dict[int, list[int]] = {}
    unreadable = 0
    for pid in all_pids(proc_root):
        try:
            inodes = _socket_links(pid, proc_root)
        except PermissionError:
            unreadable += 1
            continue
        for inode in inodes or ():
            pids = holders.setdefault(inode, [])
            if not pids or pids[-1] != pid:
                pids.append(pid)
    return holders, unreadable


class HostSockets:
    """The TCP tables, the sidecar's own sockets, the socket holders and the process tree, each read at most
    once per `max_age_s`.

    Every target's process collector runs at about the same moment; they share one read instead
    of each parsing the whole host's tables. Thread-safe: the collectors run on a thread pool.
    """

    def __init__(self, proc_root: str | Path = "/proc", max_age_s: float = 1.0, clock=time.monotonic) -> None:
        self.proc_root = proc_root
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tcp: tuple[float, TcpTable, set[int]] | None = None
        self._holders: tuple[float, dict[int, list[int]], int] | None = None
        self._parents: tuple[float, dict[int, int]] | None = None

    def tcp(self) -> tuple[TcpTable, set[int]]:
        """The TCP tables and the sidecar's own socket inodes, read together (so a scrape's two ends match)."""
        with self._lock:
            now = self._clock()
            if self._tcp is None or not 0 <= now - self._tcp[0] < self.max_age_s:
                own = socket_inodes(os.getpid(), self.proc_root)
                self._tcp = (now, TcpTable.read(self.proc_root), own)
            return self._tcp[1], self._tcp[2]

    def holders(self) -> tuple[dict[int, list[int]], int]:
        """Socket inode -> pids holding it, and the count of unreadable fd tables (a scan of every process)."""
        with self._lock:
            now = self._clock()
            if self._holders is None or not 0 <= now - self._holders[0] < self.max_age_s:
                found, unreadable = socket_holders(self.proc_root)
                self._holders = (now, found, unreadable)
            return self._holders[1], self._holders[2]

    def parents(self) -> dict[int, int]:
        """pid -> ppid of every live process (parent_map: a read of every process's stat)."""
        with self._lock:
            now = self._clock()
            if self._parents is None or not 0 <= now - self._parents[0] < self.max_age_s:
                self._parents = (now, parent_map(self.proc_root))
            return self._parents[1]
