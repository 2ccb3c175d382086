"""Where the store and the daemon's socket live by default."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# a unix socket path must fit in sockaddr_un.sun_path (108 bytes on Linux, including the NUL)
_MAX_SOCKET_PATH = 100


def default_db_path() -> Path:
    """`VLLM_SENTINEL_DB`, else the per-user data directory (XDG_DATA_HOME)."""
    env = os.environ.get("VLLM_SENTINEL_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "vllm-sentinel" / "sentinel.duckdb"


def socket_path_for(db_path: str | Path) -> Path:
    """The daemon's API socket for a database: beside it, or under /tmp when that path is too long."""
    db = Path(db_path).resolve()
    beside = db.with_name(db.name + ".sock")
    if len(str(beside)) <= _MAX_SOCKET_PATH:
        return beside
    digest = hashlib.sha256(str(db).encode()).hexdigest()[:16]
    return Path(f"/tmp/vllm-sentinel-{os.getuid()}") / f"{digest}.sock"
