"""Closed hours as Parquet files beside the DuckDB file: sorted by (series_id, ts), zstd, read through DuckDB.

A closed hour compresses to a fraction of a DuckDB table of the same rows, and its file is
immutable, so readers (a read-only CLI, offline tools) need no lock to read it. The file is
written under a temporary name, synced and renamed before the store's transaction records it,
so a kill at any point leaves either the old state or the new one, plus at most a file nobody
references, which `sweep` removes.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

import duckdb

log = logging.getLogger(__name__)

SUFFIX = ".parquet"
# v2 pages use delta encodings for the integer columns; zstd on top
COPY_OPTIONS = "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION v2"


def folder_for(db_path: str) -> Path | None:
    """The archive folder of a store file (`<file>.hours`), or None for an in-memory store."""
    return None if db_path == ":memory:" else Path(db_path + ".hours")


def sql_path(path: Path) -> str:
    """A file path as a SQL string literal (quotes doubled: the path comes from the operator's --db)."""
    return "'" + str(path).replace("'", "''") + "'"


def read_sql(path: Path) -> str:
    """A SELECT over one archive file with the partition tables' columns."""
    return f"SELECT ts, series_id, value FROM read_parquet({sql_path(path)})"


def new_name(idx: int) -> str:
    """A fresh file name for hour `idx`; a rewrite of the same hour never reuses the name a reader may hold."""
    return f"samples_{idx}_{secrets.token_hex(4)}{SUFFIX}"


def write(con: duckdb.DuckDBPyConnection, select_sql: str, folder: Path, name: str) -> Path:
    """Write `select_sql` (already ordered) to folder/name, durably: temporary file, fsync, rename, fsync folder."""
    folder.mkdir(mode=0o700, exist_ok=True)
    final = folder / name
    tmp = folder / (name + ".tmp")
    try:
        con.execute(f"COPY ({select_sql}) TO {sql_path(tmp)} ({COPY_OPTIONS})")
        _fsync(tmp)
        os.replace(tmp, final)
        _fsync(folder)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def sweep(folder: Path | None, referenced: set[str]) -> list[str]:
    """Remove files of the folder no partition references (leftovers of a killed rewrite or retention)."""
    if folder is None or not folder.is_dir():
        return []
    removed = []
    for f in folder.iterdir():
        if f.name in referenced or not (f.name.endswith(SUFFIX) or f.name.endswith(SUFFIX + ".tmp")):
            continue
        try:
            f.unlink()
            removed.append(f.name)
        except OSError as e:
            log.warning("could not remove the unreferenced archive file %s: %s", f, e)
    return removed


def remove(folder: Path | None, names: list[str]) -> None:
    """Delete archive files whose partitions are gone (a failure is logged; `sweep` retries at the next open)."""
    for name in names:
        if folder is None:
            continue
        try:
            (folder / name).unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not remove the archive file %s: %s", folder / name, e)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
