"""Drive vLLM's own V1 Scheduler (the installed vLLM) on a virtual clock, to check sim_scheduler against it.

No model runs: each step's sampled token is made up, and the clock advances by the same linear step time
the model uses. Closed-loop clients send the given requests in order, each its next when its last finished.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig, StepTime


@dataclass(frozen=True)
class Served:
    """What a scheduler served within the horizon."""

    steps: int
    finished: int
    generated_tokens: int
    preemptions: int


def drive(model_dir: Path, config: EngineConfig, step_time: StepTime, lengths: Sequence[tuple[int, int]],
          clients: int, horizon_s: float) -> Served:
    """Serve (prompt, output) lengths through vLLM's Scheduler with `clients` closed-loop clients until horizon_s."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    logging.getLogger("vllm").setLevel(logging.WARNING)
    args = EngineArgs(model=str(model_dir), max_num_seqs=config.max_num_seqs, num_gpu_blocks_override=config.num_blocks,
                      block_size=config.block_size, max_model_len=config.max_model_len,
                      max_num_batched_tokens=config.max_num_batched_tokens, enable_prefix_caching=True,
                      scheduling_policy=config.policy)
    vllm_config = args.create_engine_config()
    vllm_config.cache_config.num_gpu_blocks = config.num_blocks
    spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    kv = KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv,
                          structured_output_manager=StructuredOutputManager(vllm_config),
                          block_size=config.block_size, hash_block_size=config.block_size, log_stats=True)
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(config.block_size, hash_fn)
    clock, sent = 0.0, 0

    def send() -> None:
        nonlocal sent
        if sent >= len(lengths):
            return
        prompt, output = lengths[sent]
        # distinct token ids per request: no prefix is shared between requests, as in sim_scheduler
        tokens = [1000 + (sent * 7919 + i * 104729) % 30000 for i in range(prompt)]
        scheduler.add_request(Request(f"r{sent}", tokens, SamplingParams(max_tokens=output, ignore_eos=True), None,
                                      arrival_time=clock, block_hasher=hasher))
        sent += 1

    for _ in range(clients):
        send()
    steps = finished = generated = preemptions = 0
    while clock < horizon_s and scheduler.has_requests():
        out = scheduler.schedule()
        preemptions += len(out.preempted_req_ids or ())
        scheduled = list(out.num_scheduled_tokens)
        if not scheduled:
            continue  # every request it tried preempted itself: no forward pass
        prefill = decodes = 0
        sampled = []
        for rid in scheduled:
            req, n = scheduler.requests[rid], out.num_scheduled_tokens[rid]
            decoding = n == 1 and req.num_output_tokens > 0 and req.num_computed_tokens >= req.num_tokens
            decodes, prefill = decodes + decoding, prefill + (0 if decoding else n)
            sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
        clock += step_time.seconds(prefill, decodes, 0)
        steps += 1
        result = ModelRunnerOutput(req_ids=scheduled, req_id_to_index={r: i for i, r in enumerate(scheduled)},
                                   sampled_token_ids=sampled)
        for outputs in scheduler.update_from_output(out, result).values():
            for o in outputs.outputs:
                generated += len(o.new_token_ids)
                if o.finish_reason is not None:
                    finished += 1
                    send()
    return Served(steps, finished, generated, preemptions)
