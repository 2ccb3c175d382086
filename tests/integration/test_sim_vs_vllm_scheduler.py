"""sim_scheduler against vLLM's own scheduler: the same requests, clients and step time, the same tallies.

The what-if model's fixes are only as right as its scheduler; this runs the installed vLLM's V1 Scheduler
(no model, a virtual clock) beside it, so an upgrade that changes admission or preemption shows here.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.integration.vllm_scheduler_drive import drive
from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig, SimRequest, StepTime, simulate

pytestmark = pytest.mark.integration

STEP = StepTime(base_s=0.002, per_prefill_token_s=8e-5, per_decode_seq_s=8e-5)
HORIZON_S = 12.0
CLIENTS = 12
CASES = {  # the kv_cache_pressure load's server (8 blocks of 128, 4 sequences) and the restarts it is offered
    "as the demo runs it": EngineConfig(4, 2048, 8, 128, 512),
    "--max-num-batched-tokens 128": EngineConfig(4, 128, 8, 128, 512),
    "--max-num-seqs 2": EngineConfig(2, 2048, 8, 128, 512),
    "--num-gpu-blocks-override 16": EngineConfig(4, 2048, 16, 128, 512),
    "--num-gpu-blocks-override 5": EngineConfig(4, 2048, 5, 128, 512),
}


def _lengths(seed: int, n: int = 400) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(200 + rng.randint(0, 12), rng.choice((150, 200))) for _ in range(n)]


@pytest.mark.parametrize("name", list(CASES))
def test_the_model_serves_and_preempts_as_vllms_scheduler(name: str, tiny_model_dir: Path) -> None:
    config, lengths = CASES[name], _lengths(7)
    real = drive(tiny_model_dir, config, STEP, lengths, CLIENTS, HORIZON_S)
    model = simulate([SimRequest(0.0, p, o) for p, o in lengths], config, STEP, HORIZON_S, clients=CLIENTS)
    print(f"{name}: vLLM {real}; model steps={model.steps} finished={int(model.finished.sum())} "
          f"generated={model.generated_tokens} preemptions={model.total_preemptions}")
    assert real.finished > 20, "the load must be heavy enough to judge"
    assert model.finished.sum() == pytest.approx(real.finished, rel=0.05, abs=2)
    assert model.generated_tokens == pytest.approx(real.generated_tokens, rel=0.05)
    assert model.total_preemptions == pytest.approx(real.preemptions, rel=0.10, abs=3)
