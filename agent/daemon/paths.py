"""Where the store and the daemon's socket live by default, and whether a socket there is safe to use."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

# a unix socket path must fit in sockaddr_un.sun_path (108 bytes on Linux, including the NUL)
_MAX_SOCKET_PATH = 100


class UnsafeSocketPath(Exception):
    """The socket or its folder could be replaced by another local user: one line saying why and the fix."""


def default_db_path() -> Path:
    """`VLLM_SENTINEL_DB`, else the per-user data directory (XDG_DATA_HOME)."""
    env = os.environ.get("VLLM_SENTINEL_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "vllm-sentinel" / "sentinel.duckdb"


def fallback_socket_dir() -> Path:
    """The per-user folder under /tmp for sockets whose path beside the database would be too long."""
    return Path(f"/tmp/vllm-sentinel-{os.getuid()}")


def socket_path_for(db_path: str | Path) -> Path:
    """The daemon's API socket for a database: beside it, or under /tmp when that path is too long."""
    db = Path(db_path).resolve()
    beside = db.with_name(db.name + ".sock")
    if len(str(beside)) <= _MAX_SOCKET_PATH:
        return beside
    digest = hashlib.sha256(str(db).encode()).hexdigest()[:16]
    return fallback_socket_dir() / f"{digest}.sock"


def check_socket_dir(directory: Path, *, private: bool) -> None:
    """Refuse a folder another user could swap a socket in (UnsafeSocketPath, naming the fix).

    `private` (the /tmp fallback folder): owned by this user and mode 0700 exactly. Otherwise (the
    database's own folder): owned by this user or root, and not writable by group or others unless
    sticky (like /tmp, where nobody can replace a file they do not own).
    """
    uid = os.getuid()
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return  # nothing there to trust or distrust yet
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeSocketPath(f"socket folder {directory} is not a plain directory (a link or a file); "
                               f"remove it, or give --db a shorter path so the socket sits beside the database")
    mode = stat.S_IMODE(st.st_mode)
    owners = (uid,) if private else (uid, 0)
    if st.st_uid not in owners:
        raise UnsafeSocketPath(f"socket folder {directory} is owned by uid {st.st_uid}, not you (uid {uid}): another "
                               f"user could answer in the daemon's place; remove it (as root: rm -r {directory}) "
                               "or use a --db path of your own")
    if private and mode & 0o077:
        raise UnsafeSocketPath(f"socket folder {directory} has mode {mode:04o}, other users could replace the "
                               f"socket; run `chmod 700 {directory}` (or remove it: the daemon recreates it 0700)")
    if not private and mode & 0o022 and not mode & stat.S_ISVTX:
        raise UnsafeSocketPath(f"socket folder {directory} has mode {mode:04o} (writable by other users, who could "
                               f"replace the socket); run `chmod go-w {directory}` or keep the database elsewhere")


def check_socket(sock: Path) -> None:
    """Refuse a socket that is not this user's, or sits in a folder others can write (UnsafeSocketPath)."""
    sock = Path(sock)
    check_socket_dir(sock.parent, private=sock.parent == fallback_socket_dir())
    try:
        st = os.lstat(sock)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UnsafeSocketPath(f"{sock} is not a socket; remove it (no daemon answers there)")
    if st.st_uid != os.getuid():
        raise UnsafeSocketPath(f"socket {sock} is owned by uid {st.st_uid}, not you (uid {os.getuid()}): run as "
                               "the daemon's user, or remove it if that user runs no daemon")


def prepare_socket_dir(sock: Path) -> None:
    """Make the socket's folder ready for the daemon: the /tmp fallback created 0700; refuse an unsafe one."""
    directory = Path(sock).parent
    private = directory == fallback_socket_dir()
    if not os.path.lexists(directory):
        try:
            directory.mkdir(parents=True, mode=0o700)
            if private:
                os.chmod(directory, 0o700)  # mkdir's mode is masked by the umask; 0700 is meant exactly
        except FileExistsError:
            pass  # someone made it meanwhile: the check below judges it
    check_socket_dir(directory, private=private)
