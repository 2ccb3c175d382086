"""Close the loop on a real server: apply the fix a diagnosis suggested, run the same traffic, compare.

The demo and the integration test do the same three steps: take the incident's computed fix of
an engine flag, restart the server with it while the sidecar keeps recording (the same host and
port: one instance, a configuration snapshot with the new command line), run the scenario again,
then `compare --change auto` around the restart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm_sentinel.agent.demo.vllm_server import VllmServer, VllmServerConfig
from vllm_sentinel.agent.diagnosis.compare import CompareRequest, compare
from vllm_sentinel.agent.diagnosis.compare_sources import store_source
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator

# the flags a server of agent/demo/vllm_server.py takes as config fields
FLAG_FIELDS = {"--max-num-seqs": "max_num_seqs", "--max-num-batched-tokens": "max_num_batched_tokens",
               "--max-model-len": "max_model_len", "--num-gpu-blocks-override": "num_gpu_blocks_override"}
# the scenario's clients are back within seconds of the restart: a short margin keeps most of the run
VERIFY_SETTLE_MS = 10_000


def fix_to_apply(incidents: list[dict], incident: str) -> dict | None:
    """The first computed fix of `incident` that sets a flag the demo server takes to a whole number."""
    for inc in incidents:
        if inc["incident"] != incident:
            continue
        for fix in inc.get("fixes") or []:
            if fix.get("param") in FLAG_FIELDS and str(fix.get("suggested") or "").isdigit():
                return fix
    return None


def with_fix(config: VllmServerConfig, fix: dict) -> VllmServerConfig:
    """The server's configuration with the fix applied: {'param': '--max-num-seqs', 'suggested': '3'}."""
    return dataclasses.replace(config, **{FLAG_FIELDS[fix["param"]]: int(fix["suggested"])})


def restart_with_fix(server: VllmServer, fix: dict) -> VllmServer:
    """Restart `server` on its port with the fix applied."""
    return server.restart(with_fix(server.config, fix))


def compare_around_change(store: Any, start_ms: int, end_ms: int, pack: list) -> dict:
    """`compare --change auto` over (start_ms, end_ms] of the store: the latest change, VERIFY_SETTLE_MS margin."""
    return compare(store_source(store, pack_window_evaluator(pack)),
                   CompareRequest((start_ms, end_ms), settle_ms=VERIFY_SETTLE_MS))
