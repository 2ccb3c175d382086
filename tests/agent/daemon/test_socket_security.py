"""The API socket and its folder: another local user must never be able to answer in the daemon's place."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon import client, paths
from vllm_sentinel.agent.daemon.paths import UnsafeSocketPath, check_socket, check_socket_dir, prepare_socket_dir
from vllm_sentinel.agent.daemon.wiring import DaemonOptions, build_sidecar

OTHER_UID = 65534  # nobody
as_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


def _attacker_socket(path: Path) -> socket.socket:
    """A listening socket that answers every request with a forged status, as a planted one would."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.recv(65536)
            body = b'{"db": "forged", "interval_s": 1, "queue": 0, "collectors": []}'
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.fixture
def fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The /tmp fallback folder, moved into tmp_path so the test never touches the real one."""
    d = tmp_path / "vllm-sentinel-fallback"
    monkeypatch.setattr(paths, "fallback_socket_dir", lambda: d)
    return d


def test_the_daemon_creates_the_fallback_folder_0700(fallback: Path) -> None:
    prepare_socket_dir(fallback / "x.sock")
    assert oct(os.stat(fallback).st_mode & 0o777) == "0o700" and os.stat(fallback).st_uid == os.getuid()


def test_a_world_writable_fallback_folder_is_refused_with_the_fix(fallback: Path) -> None:
    fallback.mkdir()
    os.chmod(fallback, 0o777)
    with pytest.raises(UnsafeSocketPath, match=r"mode 0777.*chmod 700"):
        prepare_socket_dir(fallback / "x.sock")


@as_root
def test_a_fallback_folder_of_another_user_is_refused(fallback: Path) -> None:
    fallback.mkdir(mode=0o700)
    os.chown(fallback, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeSocketPath, match=f"owned by uid {OTHER_UID}"):
        check_socket_dir(fallback, private=True)


def test_a_group_writable_database_folder_is_refused_but_sticky_tmp_is_fine(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o775)
    with pytest.raises(UnsafeSocketPath, match="chmod go-w"):
        check_socket_dir(d, private=False)
    os.chmod(d, 0o1777)  # sticky, like /tmp: nobody can replace a file they do not own
    check_socket_dir(d, private=False)


@as_root
def test_the_client_refuses_a_socket_owned_by_another_user(tmp_path: Path) -> None:
    sock = tmp_path / "db.duckdb.sock"
    srv = _attacker_socket(sock)
    try:
        os.chown(sock, OTHER_UID, OTHER_UID)
        with pytest.raises(UnsafeSocketPath, match=f"owned by uid {OTHER_UID}"):
            check_socket(sock)
        with pytest.raises(client.UnsafeSocket, match="not asking the daemon"):
            client.call(sock, "/v1/status")
    finally:
        srv.close()


@as_root
def test_status_refuses_a_planted_socket_in_another_users_folder(tmp_path: Path) -> None:
    """End to end: the attacker's folder (0777, theirs) and socket; `status` says why and prints nothing forged."""
    d = tmp_path / "planted"
    d.mkdir()
    srv = _attacker_socket(d / "sentinel.duckdb.sock")
    try:
        os.chown(d, OTHER_UID, OTHER_UID)
        os.chmod(d, 0o777)
        proc = subprocess.run([sys.executable, "-m", "vllm_sentinel", "status", "--db", str(d / "sentinel.duckdb")],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    finally:
        srv.close()
    assert proc.returncode == 1 and "forged" not in proc.stdout
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert f"owned by uid {OTHER_UID}" in line and "not asking the daemon" in line


def test_the_daemon_refuses_to_start_with_its_socket_in_a_world_writable_folder(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    opts = DaemonOptions(targets=["http://127.0.0.1:9"], db=tmp_path / "db.duckdb", metrics_port=None,
                         socket_path=d / "api.sock", nvml="off")
    with pytest.raises(ValueError, match="writable by other users"):
        build_sidecar(opts)
    assert not (tmp_path / "db.duckdb").exists()  # refused before the store was opened
