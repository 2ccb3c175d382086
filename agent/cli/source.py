"""The one way a command reaches the store: ask the daemon that owns the file, else open the file itself.

A running daemon holds DuckDB's write lock, so another process cannot open the file: it answers
through its API instead (diagnose, status, report, capture). With no daemon, the command opens the
file itself, read-only unless it writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Optional, TypeVar

from vllm_sentinel.agent.daemon.client import DaemonNotRunning, call
from vllm_sentinel.agent.daemon.paths import socket_path_for
from vllm_sentinel.agent.store.db import Store, StoreLocked

T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[T]):
    """Who answered: the daemon (its JSON document) or the file (what `on_file` returned)."""

    socket: Path
    daemon: Optional[dict] = None
    file: Optional[T] = None

    def document(self, errors: "dict[str, type[Exception]]") -> "T | dict":
        """The file's answer, or the daemon's document with its source; a daemon's error key raises its exception.

        errors: the keys a route answers a domain error under ({"no_data": NoDataInWindow}), each with the
        exception the file path raises for it, so both paths fail alike."""
        if self.daemon is None:
            return self.file  # type: ignore[return-value]
        for key, exc in errors.items():
            if key in self.daemon:
                raise exc(self.daemon[key])
        return {**self.daemon, "source": f"daemon:{self.socket}"}


def ask_daemon(db: Path, route: str, params: Optional[dict] = None, timeout: float = 60.0) -> Optional[dict]:
    """The answer of the daemon that owns `db`; None when none runs (ApiError when it answers with an error)."""
    try:
        return call(socket_path_for(db), route, params, timeout=timeout)
    except DaemonNotRunning:
        return None


def daemon_or_file(db: Path, route: str, params: dict, on_file: Callable[[Store], T], *,
                   timeout: float = 60.0, read_only: bool = True) -> Answer[T]:
    """Ask the daemon's `route`; when no daemon owns `db`, run `on_file` on the file opened here.

    StoreError (StoreLocked: held by a process that is not answering) and ApiError reach the caller.
    """
    sock = socket_path_for(db)
    answer = ask_daemon(db, route, params, timeout)
    if answer is not None:
        return Answer(sock, daemon=answer)
    try:
        store = Store.open(db, read_only=read_only)
    except StoreLocked as e:
        raise StoreLocked(f"{e} No daemon answers on {sock}: if a daemon owns the file, it was started "
                          "with another --db path or its API is off.") from None
    with store:
        return Answer(sock, file=on_file(store))
