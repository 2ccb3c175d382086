"""Opening the DuckDB file, and telling its failures apart: locked, corrupt, unwritable, invalidated."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from vllm_sentinel.agent.store.migrations import MIGRATIONS, schema_version
from vllm_sentinel.agent.store.store_errors import SchemaMissing, StoreCorrupt, StoreError, StoreLocked

# DuckDB's words when the commit reached the WAL and only the checkpoint after it failed
COMMITTED_ANYWAY = "COMMIT succeeded and is durable"


def unwritable(e: Exception) -> bool:
    """True for a failure of the file, not of the data: the same commit would succeed once space returns."""
    msg = str(e)
    return isinstance(e, duckdb.IOException) or any(
        s in msg for s in ("No space left", "Could not write", "Failed to commit", "Disk quota"))


def invalidating(e: Exception) -> bool:
    """True when DuckDB has invalidated the database instance: nothing more works until it is reopened."""
    return isinstance(e, duckdb.FatalException) or "database has been invalidated" in str(e)


def open_connection(path: str, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to `path`; a lock, a missing folder or a corrupt file raise a StoreError naming the fix."""
    try:
        return duckdb.connect(path, read_only=read_only)
    except duckdb.IOException as e:
        msg = str(e)
        if "lock" in msg.lower():
            pid = re.search(r"PID (\d+)", msg)
            holder = f" (PID {pid.group(1)})" if pid else ""
            raise StoreLocked(
                f"{path} is held by another process{holder}. If it is the vllm-sentinel daemon, "
                "ask it through its API (it is used automatically when its socket exists); "
                "otherwise stop that process or copy nothing from a live file."
            ) from e
        if not read_only and not Path(path).exists():
            raise StoreError(f"cannot create {path}: {msg}. Check the directory exists and is writable.") from e
        raise StoreCorrupt(
            f"{path} could not be opened as a DuckDB database ({msg.splitlines()[0]}). "
            "Move the file aside and start with a new --db; vllm-sentinel never overwrites it."
        ) from e
    except (duckdb.Error, RuntimeError) as e:
        raise StoreCorrupt(
            f"{path} could not be opened as a DuckDB database ({str(e).splitlines()[0]}). "
            "Move the file aside and start with a new --db; vllm-sentinel never overwrites it."
        ) from e


def memory_setting(limit: str) -> str:
    """A DuckDB memory size such as 256MB or 1GiB; anything else is refused (it is put into SQL)."""
    if not re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)", limit.strip(), re.IGNORECASE):
        raise StoreError(f"store memory limit {limit!r} (--store-memory) is not a size such as 256MB or 1GiB")
    return limit.strip()


def check_schema(con: duckdb.DuckDBPyConnection, path: str) -> None:
    """Refuse (closing `con`) a file opened read-only whose schema is missing or older than this version's."""
    have, want = schema_version(con), MIGRATIONS[-1][0]
    if have == 0:
        con.close()
        raise SchemaMissing(f"{path} is not a vllm-sentinel database (no schema). Point --db at the file "
                            "the daemon or `ingest` writes.")
    if have < want:
        con.close()
        raise SchemaMissing(f"{path} has schema version {have}, this vllm-sentinel needs {want}. Open it once "
                            "read-write (start the daemon, or `vllm-sentinel ingest`) to migrate it.")
