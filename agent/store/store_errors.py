"""The store's errors: each names what an operator can do about it."""

from __future__ import annotations

from vllm_sentinel.agent.store.sample_checks import Rejected


class StoreError(Exception):
    """A store problem an operator can act on; the message names the fix."""


class StoreLocked(StoreError):
    """Another process holds the DuckDB file."""


class StoreCorrupt(StoreError):
    """The file is not a readable DuckDB database."""


class SchemaMissing(StoreError):
    """A read-only open found no (or an older) vllm-sentinel schema."""


class StoreUnwritable(StoreError):
    """The file cannot be written (disk full, I/O error): nothing of that commit was stored."""


class SamplesRejected(StoreError):
    """Samples the store cannot hold (time outside 1970..2262, broken labels); nothing of that call was stored."""

    def __init__(self, rejected: list[Rejected]):
        self.rejected = rejected
        total = sum(r.count for r in rejected)
        super().__init__(f"{total} sample(s) refused and nothing of them stored: {rejected[0].message}")
