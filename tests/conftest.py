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


CI_HOST_RECORDING = Path(__file__).parent / "agent" / "fixtures" / "restarts" / "ci-host-2026-12-07.prom.gz"


@pytest.fixture(scope="session")
def ci_host_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The CI host's three restarts (tests/agent/fixtures/restarts/README.md) replayed once into a DuckDB file, and
    the recording's metadata (its windows by trial). Open it read-only."""
    from vllm_sentinel.agent.demo.replay import load_metadata

    path = tmp_path_factory.mktemp("ci-host") / "restarts.duckdb"
    with Store.open(path) as store:
        replay_into(store, CI_HOST_RECORDING)
    return path, load_metadata(CI_HOST_RECORDING)
