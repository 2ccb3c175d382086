"""Fixtures shared across the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.agent.demo.replay import default_recording, replay_into
from vllm_sentinel.agent.store.db import Store


@pytest.fixture(scope="session")
def recorded_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """The recorded real session replayed once into a DuckDB file: (path, first ms, last ms). Open it read-only,
    or copy it before writing: every test that asks for it shares it."""
    path = tmp_path_factory.mktemp("recorded") / "session.duckdb"
    with Store.open(path) as store:
        first, last = replay_into(store, default_recording())
    return path, first, last
