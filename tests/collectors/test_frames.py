"""collectors/frames.py on real vLLM 0.32 captures (fixtures/pyspy, see its README) and on single stacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.collectors import frames as fr
from vllm_sentinel.collectors import pyspy as ps

FIXTURES = Path(__file__).parent / "fixtures" / "pyspy"


def _record(role: str) -> fr.ProcessProfile:
    stacks = ps.parse_folded((FIXTURES / f"load-record-{role}.txt").read_text())
    return fr.summarize(stacks, role=role, active=True)  # recorded without --idle: every sample was on CPU


def _dump(name: str) -> fr.ProcessProfile:
    return fr.summarize(ps.dump_to_folded(ps.parse_dump_json((FIXTURES / f"{name}.json").read_bytes())))


@pytest.mark.parametrize("role", ["api_server", "engine_core", "worker"])
def test_real_records_are_mostly_classified(role):
    profile = _record(role)
    assert profile.samples > 50
    assert profile.classified_share >= 0.9, profile.to_dict()


def test_worker_under_load_spends_its_time_in_model_forward():
    busy = _record("worker").busy_shares()
    assert max(busy, key=busy.get) == fr.MODEL_FORWARD
    assert busy[fr.MODEL_FORWARD] > 0.5
    assert busy.get(fr.SAMPLING, 0) > 0  # the sampler shows up too, apart from the forward pass
    top = _record("worker").top_frames[0]
    assert top[0].startswith("LlamaModel.forward (vllm/model_executor/models/llama.py") and top[1] == fr.MODEL_FORWARD


def test_engine_core_under_load_waits_on_its_worker_and_schedules():
    busy = _record("engine_core").busy_shares()
    assert max(busy, key=busy.get) == fr.COLLECTIVE  # EngineCore spins on the shared-memory queue for results
    assert busy.get(fr.SCHEDULING, 0) > 0


def test_api_server_under_load_does_http_and_tokenization():
    busy = _record("api_server").busy_shares()
    assert busy.get(fr.HTTP, 0) > 0.3
    assert busy.get(fr.TOKENIZATION, 0) > 0.1


def test_idle_server_is_all_idle_wait():
    for role in ("api_server", "engine_core", "worker"):
        profile = _dump(f"idle-dump-{role}")
        assert profile.class_samples == {fr.IDLE: profile.samples}, (role, profile.to_dict())


def test_stalled_engine_core_shows_where_it_is():
    profile = _dump("stall-dump-engine_core")
    where = " ".join(profile.main_thread)
    assert "EngineCore.step (vllm/v1/engine/core.py" in where and "get_response" in where
    assert "MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py" in where
    assert profile.top_frames[0][1] == fr.COLLECTIVE


def test_to_dict_is_plain_json_data():
    d = _record("worker").to_dict()
    assert set(d) == {"pid", "role", "samples", "class_shares", "busy_shares", "top_frames", "main_thread"}
    assert abs(sum(d["class_shares"].values()) - 1) < 0.01
    assert d["top_frames"][0]["class"] == fr.MODEL_FORWARD


W = "vllm/distributed/device_communicators/shm_broadcast.py"


@pytest.mark.parametrize(("frames", "active", "cls"), [
    # the worker waits for the next step from the scheduler
    ([f"WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)",
      f"MessageQueue.dequeue ({W}:971)", f"SpinCondition.wait ({W}:210)", "Poller.poll (zmq/sugar/poll.py:106)"],
     None, fr.IDLE),
    # EngineCore waits for the workers' results
    ([f"EngineCore.step (vllm/v1/engine/core.py:674)",
      "MultiprocExecutor.collective_rpc.<locals>.get_response (vllm/v1/executor/multiproc_executor.py:440)",
      f"MessageQueue.dequeue ({W}:971)", "sched_yield (vllm/distributed/utils.py:46)"], None, fr.COLLECTIVE),
    (["all_reduce (torch/distributed/distributed_c10d.py:2800)"], None, fr.COLLECTIVE),
    (["GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:3645)",
      "Module._call_impl (torch/nn/modules/module.py:1789)", "OpOverload.__call__ (torch/_ops.py:875)"],
     None, fr.MODEL_FORWARD),
    (["GPUModelRunner.sample_tokens (vllm/v1/worker/gpu_model_runner.py:4400)",
      "Sampler.forward (vllm/v1/sample/sampler.py:90)", "OpOverload.__call__ (torch/_ops.py:875)"],
     None, fr.SAMPLING),
    (["EngineCore.step (vllm/v1/engine/core.py:668)", "Scheduler.schedule (vllm/v1/core/sched/scheduler.py:300)",
      "KVCacheManager.allocate_slots (vllm/v1/core/kv_cache_manager.py:250)"], None, fr.SCHEDULING),
    (["BaseRenderer._tokenize_prompt (vllm/renderers/base.py:638)",
      "PreTrainedTokenizerBase.__call__ (transformers/tokenization_utils_base.py:2513)"], None, fr.TOKENIZATION),
    (["IncrementalDetokenizer.update (vllm/v1/engine/detokenizer.py:120)"], None, fr.TOKENIZATION),
    (["get_request_handler.<locals>.app (fastapi/routing.py:457)",
      "TypeAdapter.validate_python (pydantic/type_adapter.py:410)"], None, fr.HTTP),
    # uvloop's C loop as the leaf: polling unless py-spy saw the thread running
    (["main (vllm/entrypoints/launchers/api_server/entry.py:232)", "run (uvloop/__init__.py:92)",
      "Runner.run (asyncio/runners.py:118)"], None, fr.IDLE),
    (["main (vllm/entrypoints/launchers/api_server/entry.py:232)", "run (uvloop/__init__.py:92)",
      "Runner.run (asyncio/runners.py:118)"], True, fr.HTTP),
    (["Thread.run (threading.py:982)", "_worker (concurrent/futures/thread.py:81)"], True, fr.IDLE),
    (["mystery (somewhere/else.py:1)"], None, fr.OTHER),
])
def test_classify_stack(frames, active, cls):
    assert fr.classify_stack(frames, active) == cls


def test_parse_frame():
    f = fr.parse_frame("EngineCore.step (vllm/v1/engine/core.py:674)")
    assert (f.func, f.file, f.line) == ("EngineCore.step", "vllm/v1/engine/core.py", "674")
    g = fr.parse_frame("_runtime_wrapper (torch/x.py:codegen(runtime_wrapper_orchestration):8)")
    assert g.func == "_runtime_wrapper" and g.file.startswith("torch/x.py")
    assert fr.parse_frame("MainThread").func == "MainThread"


def test_split_stack():
    assert fr.split_stack("thread (7): MainThread [idle];a (x.py:1);b (y.py:2)") == (
        "thread (7): MainThread [idle]", ["a (x.py:1)", "b (y.py:2)"])
    assert fr.split_stack("process 9:\"python x\";a (x.py:1)") == (None, ["a (x.py:1)"])
