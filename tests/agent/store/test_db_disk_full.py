"""The store when its file cannot grow: every failure is StoreUnwritable, nothing is stored twice or lost.

DuckDB meets a full disk two ways. When the WAL cannot be written, the commit fails and the
connection stays usable. When the checkpoint after a commit cannot be written, the commit is
durable but DuckDB invalidates the whole database instance: the store must count that tick as
stored (or the caller's retry would write it twice) and reopen the file before the next write.

A real full disk (a tmpfs) reaches one or the other depending on sizes, so each is forced here: the
WAL way with a tmpfs filled to the last block, the checkpoint way with a file-size limit
(RLIMIT_FSIZE) that the WAL stays under and the database file reaches. In both, space then comes
back and the caller retries what failed, as the daemon's committer does.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.agent.daemon.test_daemon_disk_full import small_disk  # noqa: F401 - the fixture

WRITER = r"""
import json, os, random, resource, signal, sys
from pathlib import Path
from vllm_sentinel.agent.store.db import Store, StoreUnwritable
from vllm_sentinel.collectors.base import Batch
sys.path.insert(0, os.getcwd())
from tests.agent.daemon.test_daemon_disk_full import fill

path, way = Path(sys.argv[1]), sys.argv[2]
T0 = 1_795_946_400_000
def tick(n):
    b = Batch(instance="a", ts_ms=T0 + n * 1000)
    for i in range(2000):
        b.add("m", f'i="{i}"', random.random())
    return b

store = Store.open(path)
filler = None
if way == "checkpoint":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
    store.con.execute("SET wal_autocheckpoint = '512KB'")  # the WAL stays small, the file grows
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, hard))
stored, failed, errors = [], [], []
for n in range(2000):
    if way == "wal" and n == 5:
        filler = fill(path.parent)
    try:
        store.append(tick(n))
        stored.append(n)
    except StoreUnwritable as e:
        failed.append(n)
        errors.append(str(e))
        if len(failed) >= 3:
            break
if way == "checkpoint":
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
elif filler is not None:
    filler.unlink()
for f in failed:  # the caller retries what failed, once space is back
    store.append(tick(f))
    stored.append(f)
store.append(tick(n + 1))
stored.append(n + 1)
store.close()
print(json.dumps({"stored": stored, "failed": failed, "errors": errors}))
"""


def run_writer(path, way: str) -> dict:
    res = subprocess.run([sys.executable, "-c", WRITER, str(path), way], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


def check_each_tick_once(path, stored: list[int]) -> None:
    from vllm_sentinel.agent.store.db import Store
    with Store.open(path, read_only=True) as r:
        rows = dict(r.con.execute("SELECT ts, count(*) FROM samples GROUP BY ts").fetchall())
        orphans = r.con.execute("SELECT count(*) FROM samples WHERE series_id NOT IN "
                                "(SELECT series_id FROM series)").fetchone()[0]
    assert sorted((ts - 1_795_946_400_000) // 1000 for ts in rows) == sorted(stored)
    assert set(rows.values()) == {2000}  # each tick once: none written twice, none half
    assert orphans == 0


def test_wal_write_on_a_full_disk_fails_the_commit_and_the_retry_stores_it(small_disk):  # noqa: F811
    path = small_disk / "s.duckdb"
    out = run_writer(path, "wal")
    assert out["failed"] and all("Free space on its disk" in e for e in out["errors"]), out["errors"]
    check_each_tick_once(path, out["stored"])


def test_a_failed_checkpoint_after_a_durable_commit_counts_as_stored_and_the_file_is_reopened(tmp_path):
    path = tmp_path / "s.duckdb"
    out = run_writer(path, "checkpoint")
    # the commit that met the limit in its checkpoint was durable: not reported failed, not retried
    assert out["failed"], "the file never reached its size limit"
    assert all("Free space on its disk" in e for e in out["errors"]), out["errors"]
    check_each_tick_once(path, out["stored"])
