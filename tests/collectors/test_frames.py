"""collectors/frames.py on real vLLM 0.32 captures (fixtures/pyspy and fixtures/frames, see their READMEs) and on single stacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_sentinel.collectors import frames as fr
from vllm_sentinel.collectors import pyspy as ps

FIXTURES = Path(__file__).parent / "fixtures" / "pyspy"
OTHER_FIXTURES = Path(__file__).parent / "fixtures" / "frames"


def _other_before() -> list[tuple[str, str, str]]:
    """(class now, role, stack) of each real stack the classifier once left in `other`."""
    rows = []
    for line in (OTHER_FIXTURES / "other-before.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            cls, role, _, stack = line.split("\t")
            rows.append((cls, role, stack))
    return rows


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


@pytest.mark.parametrize(("cls", "role", "stack"), _other_before(),
                         ids=lambda v: v.split(";")[-1][:60] if isinstance(v, str) else str(v))
def test_stacks_once_left_in_other_get_their_class(cls, role, stack):
    _, frames = fr.split_stack(stack)
    assert fr.classify_stack(frames, active=True) == cls, (role, frames)  # recorded without --idle: running


def test_every_stack_once_left_in_other_either_got_a_class_or_is_no_vllm_stack():
    # what stays `other` is py-spy's torn reads (no frame, or cut short of the root) and thread-pool
    # plumbing of the API server that no longer shows which job it ran: no vLLM frame the rules miss
    for cls, _, stack in _other_before():
        _, frames = fr.split_stack(stack)
        if cls == fr.OTHER:
            assert not fr.complete_stack(frames) or not any("vllm/" in f for f in frames), frames


@pytest.mark.parametrize("role", ["engine_core", "worker"])
def test_worst_real_records_leave_only_unreadable_samples_in_other(role):
    # the records with the largest `other` share of 27 per process (fixtures/frames/README.md)
    stacks = ps.parse_folded((OTHER_FIXTURES / f"load-record-{role}.txt").read_text())
    other = {s: n for s, n in stacks.items() if fr.classify_stack(fr.split_stack(s)[1], True) == fr.OTHER}
    assert other and all(not fr.complete_stack(fr.split_stack(s)[1]) for s in other), other
    profile = fr.summarize(stacks, role=role, active=True)
    assert profile.share(fr.OTHER) < 0.08, profile.to_dict()
    busy = profile.busy_shares()
    assert max(busy, key=busy.get) == (fr.COLLECTIVE if role == "engine_core" else fr.MODEL_FORWARD), busy


def test_complete_stack():
    assert fr.complete_stack(["<module> (<string>:1)", "spawn_main (multiprocessing/spawn.py:122)"])
    assert fr.complete_stack(["_run_module_as_main (<frozen runpy>:198)", "main (x.py:1)"])
    assert fr.complete_stack(["Thread._bootstrap (threading.py:1002)", "Thread.run (threading.py:982)"])
    assert not fr.complete_stack([])
    assert not fr.complete_stack(["Condition.notify (threading.py:382)"])
    assert not fr.complete_stack(["__create_fn__.<locals>.__init__ (<string>:7)", "Enum.__hash__ (enum.py:1231)"])


def test_to_dict_is_plain_json_data():
    d = _record("worker").to_dict()
    assert set(d) == {"pid", "role", "samples", "class_shares", "busy_shares", "top_frames", "main_thread"}
    assert abs(sum(d["class_shares"].values()) - 1) < 0.01
    assert d["top_frames"][0]["class"] == fr.MODEL_FORWARD


W = "vllm/distributed/device_communicators/shm_broadcast.py"
E = "vllm/v1/executor/multiproc_executor.py"


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
    # the worker starts the step EngineCore asked for, hands its output back, and loops to the next one
    # (the Python frames of real worker records under load; handing back seen in a blocking --native one)
    ([f"WorkerProc.worker_busy_loop ({E}:1041)", f"WorkerProc._execute_worker_rpc ({E}:1055)",
      "context_decorator.<locals>.decorate_context (torch/utils/_contextlib.py:123)",
      "inference_mode.__enter__ (torch/autograd/grad_mode.py:291)"], True, fr.MODEL_FORWARD),
    ([f"WorkerProc.worker_busy_loop ({E}:1041)", f"WorkerProc._execute_worker_rpc ({E}:1058)",
      f"WorkerProc.handle_output ({E}:1018)", f"WorkerProc.enqueue_output ({E}:1006)"], True, fr.COLLECTIVE),
    ([f"WorkerProc.worker_busy_loop ({E}:1041)", f"WorkerProc._execute_worker_rpc ({E}:1058)",
      f"WorkerProc.handle_output ({E}:1018)", f"WorkerProc.enqueue_output ({E}:1008)",
      f"MessageQueue.enqueue ({W}:956)", f"SpinCondition.notify ({W}:225)", "Socket.send (zmq/sugar/socket.py:713)"],
     True, fr.COLLECTIVE),
    ([f"WorkerProc.worker_main ({E}:944)", f"WorkerProc.worker_busy_loop ({E}:1041)"], True, fr.IDLE),
    (["Thread.run (threading.py:982)", f"WorkerProc.async_output_busy_loop ({E}:1036)",
      "Queue.get (queue.py:171)", "Condition.wait (threading.py:327)"], None, fr.IDLE),
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
