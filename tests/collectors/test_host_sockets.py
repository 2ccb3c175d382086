"""The host's socket tables: parsed once, shared by every target's collector for a moment, re-read after it."""

from __future__ import annotations

import os
import socket

from vllm_sentinel.collectors.host_sockets import HostSockets, TcpTable, endpoint, socket_holders
from vllm_sentinel.collectors.process import ProcessCollector

HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(n: int, local: str, remote: str, state: str, inode: int) -> str:
    return f"  {n}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  0  0 {inode} 1\n"


def _proc(tmp_path, rows: list[str]) -> None:
    (tmp_path / "net").mkdir(exist_ok=True)
    (tmp_path / "net" / "tcp").write_text(HEAD + "".join(rows))
    (tmp_path / "net" / "tcp6").write_text(HEAD)


def test_table_keeps_listeners_and_connections_and_skips_time_wait(tmp_path):
    _proc(tmp_path, [
        _row(0, "00000000:1F40", "00000000:0000", "0A", 700),       # listening on 8000
        _row(1, "0100007F:1F40", "0100007F:C350", "01", 801),       # server end of a client on 50000
        _row(2, "0100007F:C350", "0100007F:1F40", "01", 802),       # that client's own end
        _row(3, "0100007F:1F40", "0100007F:C352", "06", 0),         # TIME_WAIT: not a connection
        _row(4, "0100007F:1F41", "0100007F:C353", "01", 803),       # another port
        "   5: garbage\n",
    ])
    table = TcpTable.read(tmp_path)
    assert table.listening == {8000: {700}}
    assert table.clients(8000) == 1  # the server's end; the client's own row has local port 50000, TIME_WAIT none
    assert table.clients(8001) == 1
    assert table.clients(8000, {802}) == 0  # 802 is the sidecar's end of that connection: its own scrape
    assert table.clients(8000, {803}) == 1  # an end of another connection excludes nothing here
    assert table.clients(9999) == 0
    assert endpoint("0100007F:1F40") == ("127.0.0.1", 8000)


def test_shared_reads_hold_for_max_age_then_reread(tmp_path):
    _proc(tmp_path, [_row(0, "0100007F:1F40", "0100007F:C350", "01", 801)])
    now = [100.0]
    shared = HostSockets(tmp_path, max_age_s=1.0, clock=lambda: now[0])
    assert shared.tcp()[0].clients(8000) == 1
    _proc(tmp_path, [_row(0, "0100007F:1F40", "0100007F:C350", "01", 801),
                     _row(1, "0100007F:1F40", "0100007F:C351", "01", 802)])
    now[0] += 0.5
    assert shared.tcp()[0].clients(8000) == 1  # the same moment's read, shared
    now[0] += 0.6
    assert shared.tcp()[0].clients(8000) == 2  # older than max_age: read again
    now[0] -= 10  # a clock that went back is no reason to keep an old read
    _proc(tmp_path, [])
    assert shared.tcp()[0].clients(8000) == 0


def test_socket_holders_map_every_socket_to_its_processes(tmp_path):
    for pid, links in ((10, ["socket:[700]", "/dev/null"]), (11, ["socket:[700]", "socket:[701]"])):
        (tmp_path / str(pid) / "fd").mkdir(parents=True)
        for fd, link in enumerate(links):
            os.symlink(link, tmp_path / str(pid) / "fd" / str(fd))
    holders, unreadable = socket_holders(tmp_path)
    assert holders == {700: [10, 11], 701: [11]} and unreadable == 0


def test_collectors_sharing_one_read_count_the_same_clients_as_each_alone():
    # a real listener with three clients on this host: every collector, shared read or its own, counts them
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            shared = HostSockets(max_age_s=60.0)
            for _ in range(2):
                batch = ProcessCollector(f"127.0.0.1:{port}", sockets=shared).collect(1_000)
                got = {m: v for m, v in zip(batch.metrics, batch.values)}
                # this process listens and holds the clients too: their ends are its own sockets, not counted
                assert got["vllm_sentinel_server_client_connections"] == 0.0
            table, own = shared.tcp()
            assert table.clients(port) == 3
            assert table.clients(port, own) == 0
            alone = ProcessCollector(f"127.0.0.1:{port}").collect(2_000)
            assert dict(zip(alone.metrics, alone.values))["vllm_sentinel_server_client_connections"] == 0.0
        finally:
            for c in clients:
                c.close()


def test_the_process_tree_is_shared_for_max_age_then_reread(tmp_path):
    def stat(pid: int, ppid: int, state: str = "S") -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (vllm (api) server) {state} {ppid} 1 1 0\n")

    stat(10, 1)
    stat(11, 10)
    stat(12, 10, "Z")  # a zombie is dead: not in the tree
    now = [100.0]
    shared = HostSockets(tmp_path, max_age_s=1.0, clock=lambda: now[0])
    assert shared.parents() == {10: 1, 11: 10}
    stat(13, 11)
    now[0] += 0.5
    assert shared.parents() == {10: 1, 11: 10}  # the same moment's scan, shared by every target's discovery
    now[0] += 0.6
    assert shared.parents() == {10: 1, 11: 10, 13: 11}
