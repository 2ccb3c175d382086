"""Classify py-spy stacks into the parts of serving an operator knows, and summarise a capture.

Classes (ids are stable; reports show the labels):
  http_serialization   HTTP server, request validation, response building, (de)serialising messages
  tokenization         tokenizing prompts, detokenizing outputs, input preprocessing
  scheduling           the engine loop and scheduler: batch selection, KV block bookkeeping
  model_forward        the model's forward pass (layers, attention, compiled graphs, kernels)
  sampling             logits processing and sampling of the next tokens
  collective_wait      waiting on other ranks or processes: collectives, the engine waiting for its workers
  idle_wait            nothing to do: event loop polling, queue gets, the worker waiting for the next step
  other                anything not recognised

How a stack is classified (frames root first, as py-spy prints 'function (file:line)'): walk from the
leaf toward the root. Wait primitives (Condition.wait, selectors, zmq poll, the shared-memory queue's
spin) and plumbing (threading, contextlib, torch dispatch) decide nothing by themselves; wait
primitives only remember that the thread is blocked. The first frame that matches a rule decides,
with the rule's class for a running or a blocked thread. A blocked thread nothing claims is idle.
Rules were written against dumps of vLLM 0.32 (tests/collectors/fixtures/pyspy/) and checked against the
stacks that fell into `other` under load (tests/collectors/fixtures/frames/).

`other` also holds what py-spy could not read whole: `--nonblocking` copies a thread's state and then its
frames one by one while the thread runs, so now and then a sample of a running thread comes back with no
frame at all or cut short of its root (a few percent of an EngineCore's or worker's samples under load;
none seen in blocking captures). `complete_stack` tells those apart from stacks the rules do not know.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

HTTP = "http_serialization"
TOKENIZATION = "tokenization"
SCHEDULING = "scheduling"
MODEL_FORWARD = "model_forward"
SAMPLING = "sampling"
COLLECTIVE = "collective_wait"
IDLE = "idle_wait"
OTHER = "other"

CLASSES = (HTTP, TOKENIZATION, SCHEDULING, MODEL_FORWARD, SAMPLING, COLLECTIVE, IDLE, OTHER)
LABELS = {
    HTTP: "HTTP / serialization",
    TOKENIZATION: "tokenization / detokenization",
    SCHEDULING: "scheduling",
    MODEL_FORWARD: "model forward",
    SAMPLING: "sampling",
    COLLECTIVE: "collective communication wait",
    IDLE: "idle wait",
    OTHER: "other",
}

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::(?P<line>[^:()]*))?\)$")


@dataclass(frozen=True)
class Frame:
    """One frame: function (qualified as py-spy gives it), file (short, e.g. 'vllm/v1/engine/core.py'), line."""

    func: str
    file: str
    line: str = ""

    def __str__(self) -> str:
        return f"{self.func} ({self.file}:{self.line})" if self.line else f"{self.func} ({self.file})"


def parse_frame(text: str) -> Frame:
    """'EngineCore.step (vllm/v1/engine/core.py:674)' -> Frame('EngineCore.step', 'vllm/v1/engine/core.py', '674')."""
    m = _FRAME.match(text.strip())
    if not m:
        return Frame(text.strip(), "")
    return Frame(m.group("func"), m.group("file"), m.group("line") or "")


@dataclass(frozen=True)
class _Rule:
    """Frames whose file contains one of `files` (and, if given, whose function matches `func`)."""

    busy: str | None  # class when nothing below this frame was waiting; None: no decision
    blocked: str | None  # class when a wait primitive lies below it
    files: tuple[str, ...] = ()
    func: re.Pattern[str] | None = None

    def matches(self, frame: Frame) -> bool:
        if self.files and not any(f in frame.file for f in self.files):
            return False
        return self.func is None or bool(self.func.search(frame.func))


def _r(busy: str | None, blocked: str | None, files: tuple[str, ...] | str = (), func: str | None = None) -> _Rule:
    return _Rule(busy, blocked, (files,) if isinstance(files, str) else files,
                 re.compile(func) if func else None)


# Wait primitives: a thread whose leaf-side frames are these is blocked, not working.
_WAITS: tuple[_Rule, ...] = (
    _r(None, None, "threading.py", r"(Condition|Event|Semaphore|Barrier)\.wait|^wait$|Thread\.join|_wait_for_tstate_lock"),
    _r(None, None, "queue.py", r"Queue\.get$"),
    _r(None, None, "selectors.py"),
    _r(None, None, ("zmq/sugar/poll.py", "zmq/green/")),
    _r(None, None, "zmq/sugar/socket.py", r"recv"),
    _r(None, None, "multiprocessing/connection.py", r"^wait$|recv|_poll|poll"),
    _r(None, None, "multiprocessing/synchronize.py"),
    _r(None, None, ("concurrent/futures/_base.py",), r"Future\.result|wait|as_completed"),
    _r(None, None, "asyncio/base_events.py", r"_run_once|run_forever|select"),
    # the shared-memory message queue between EngineCore and workers spins (sched_yield) while empty
    _r(None, None, "vllm/distributed/device_communicators/shm_broadcast.py",
       r"acquire_read|dequeue|SpinCondition\.wait|ReadTimeout|memory_fence|recv"),
    _r(None, None, "vllm/distributed/utils.py", r"sched_yield"),
)

# Leaf-only waits: with nothing below them, these frames block in C (a thread pool's queue.get).
_LEAF_WAITS: tuple[_Rule, ...] = (
    _r(None, None, "concurrent/futures/thread.py", r"^_worker$"),
    _r(None, None, "anyio/_backends/", r"WorkerThread\.run"),
    _r(None, None, "tqdm/_monitor.py"),
)
# An event loop run from C (uvloop) as the leaf is either polling or working in C (parsing HTTP,
# socket I/O): waiting unless py-spy saw the thread running.
_LEAF_LOOPS: tuple[_Rule, ...] = (
    _r(None, None, "uvloop/"),
    _r(None, None, "asyncio/runners.py"),
)

# Ordered rules; for each frame (leaf first) the first matching rule gives the class.
_RULES: tuple[_Rule, ...] = (
    # waiting on other processes: collectives, and EngineCore's RPC to its workers
    _r(COLLECTIVE, COLLECTIVE, ("torch/distributed/", "vllm/distributed/communication_op.py",
                                "vllm/distributed/device_communicators/", "vllm/distributed/parallel_state.py")),
    _r(COLLECTIVE, COLLECTIVE, "vllm/v1/executor/", r"collective_rpc|get_response|FutureWrapper|_wait_for_response"),
    # sampling before model forward: the sampler calls torch too
    _r(SAMPLING, SAMPLING, ("vllm/v1/sample/", "vllm/model_executor/layers/logits_processor",
                            "vllm/v1/spec_decode/", "vllm/sampling_params.py")),
    _r(SAMPLING, SAMPLING, "vllm/v1/worker/", r"sample_tokens|_sample|compute_logits|_bookkeeping_sync"),
    _r(SAMPLING, SAMPLING, "vllm/model_executor/", r"compute_logits"),
    _r(MODEL_FORWARD, MODEL_FORWARD, ("vllm/model_executor/", "vllm/attention/", "vllm/v1/attention/",
                                      "vllm/_custom_ops.py", "vllm/compilation/", "vllm/forward_context.py",
                                      "torch/_inductor/", "torch/_dynamo/", "torch/_functorch/",
                                      "torch/nn/modules/", "torch/nn/functional.py")),
    _r(MODEL_FORWARD, MODEL_FORWARD, "vllm/v1/worker/", r"execute_model|_model_forward|_prepare_inputs|_dummy_run"),
    # scheduling: the scheduler, KV-cache bookkeeping, and the engine loop's own work
    _r(SCHEDULING, SCHEDULING, ("vllm/v1/core/", "vllm/v1/structured_output/")),
    _r(SCHEDULING, IDLE, "vllm/v1/engine/core.py", r"_process_input_queue|run_busy_loop|_handle_client_request"),
    _r(HTTP, IDLE, "vllm/v1/engine/core.py", r"process_input_sockets|process_output_sockets|_send_msg"),
    _r(SCHEDULING, SCHEDULING, "vllm/v1/engine/core.py", r"EngineCore\.step|_process_engine_step|schedule|add_request|abort"),
    # the worker hands a step's output back to EngineCore (through the shared-memory queue, like the
    # collectives above); before that, it starts the step EngineCore asked for (execute_model, ...)
    _r(COLLECTIVE, IDLE, "vllm/v1/executor/", r"handle_output|enqueue_output|async_output_busy_loop"),
    _r(MODEL_FORWARD, None, "vllm/v1/executor/", r"_execute_worker_rpc"),
    # the worker's loop between two steps is the worker waiting for the next one, running or not
    _r(IDLE, IDLE, "vllm/v1/executor/", r"worker_busy_loop"),
    # startup, and watchdogs that run only when a process dies: nothing the operator asks about
    _r(OTHER, IDLE, "vllm/v1/executor/", r"worker_main|monitor|death_pipe"),
    # tokenization and detokenization
    _r(TOKENIZATION, TOKENIZATION, ("vllm/tokenizers/", "vllm/transformers_utils/tokenizer",
                                    "vllm/v1/engine/detokenizer.py", "transformers/tokenization",
                                    "tokenizers/", "vllm/renderers/", "vllm/v1/engine/input_processor.py",
                                    "vllm/v1/engine/processor.py", "vllm/inputs/", "vllm/multimodal/")),
    _r(TOKENIZATION, TOKENIZATION, ("vllm/entrypoints/",), r"tokeniz|render|_preprocess|apply_chat_template"),
    # HTTP, validation, response building, message (de)serialisation, the frontend's bookkeeping
    # (blocked there means the frontend waits for the network or the engine: idle)
    _r(HTTP, IDLE, ("uvicorn/", "starlette/", "fastapi/", "h11/", "httptools/", "pydantic/", "pydantic_core/",
                    "json/", "orjson", "msgspec", "vllm/v1/serial_utils.py", "vllm/entrypoints/",
                    "vllm/v1/engine/output_processor.py", "vllm/v1/engine/async_llm.py",
                    "vllm/v1/engine/core_client.py", "vllm/v1/metrics/", "prometheus_client/",
                    "prometheus_fastapi_instrumentator/", "anyio/", "sse_starlette/")),
)

# Plumbing that never decides: interpreter startup, threads, context managers, torch dispatch
_NEUTRAL = ("threading.py", "contextlib.py", "runpy", "multiprocessing/spawn.py", "multiprocessing/process.py",
            "torch/_ops.py", "torch/utils/_contextlib.py", "torch/autograd/grad_mode.py", "<string>",
            "functools.py", "abc.py",
            "zmq/", "asyncio/", "concurrent/futures/")


def classify_stack(frames: list[str] | list[Frame], active: bool | None = None) -> str:
    """Class of one stack, frames root first; `active` is py-spy's verdict on the thread, if known.

    ['worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)',
     'MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:971)'] -> 'idle_wait'

    A leaf in uvloop is C code either polling or working (parsing HTTP); unless py-spy says the
    thread was running, it counts as waiting.
    """
    parsed = [f if isinstance(f, Frame) else parse_frame(f) for f in frames]
    blocked = False
    leaf_waits = _LEAF_WAITS if active is True else _LEAF_WAITS + _LEAF_LOOPS
    for depth, frame in enumerate(reversed(parsed)):
        if any(w.matches(frame) for w in _WAITS) or (depth == 0 and any(w.matches(frame) for w in leaf_waits)):
            blocked = True
            continue
        if any(n in frame.file for n in _NEUTRAL):
            continue
        for rule in _RULES:
            if rule.matches(frame):
                cls = rule.blocked if blocked else rule.busy
                if cls is not None:
                    return cls
    return IDLE if blocked else OTHER


def complete_stack(frames: list[str] | list[Frame]) -> bool:
    """Whether a stack (root first) starts where a Python thread starts: a module's top level, runpy or a Thread.

    A `--nonblocking` read that raced the running thread comes back empty or cut short and fails this;
    so does a thread some C library started and called into, which this cannot tell apart.
    """
    if not frames:
        return False
    root = frames[0] if isinstance(frames[0], Frame) else parse_frame(frames[0])
    return (root.func == "<module>" or root.func == "_run_module_as_main"
            or (root.func == "Thread._bootstrap" and "threading.py" in root.file))


def anchor_frame(frames: list[str]) -> str:
    """The frame an operator should read: the leaf-most vLLM frame, else the leaf ('' for an empty stack)."""
    for f in reversed(frames):
        if "vllm/" in f:
            return f
    return frames[-1] if frames else ""


@dataclass
class ProcessProfile:
    """Summary of one process's capture: class shares, hot frames, and where its main thread is."""

    pid: int
    role: str
    samples: int
    class_samples: dict[str, int]
    top_frames: list[tuple[str, str, int]]  # (frame, class, samples), busy work first
    main_thread: list[str] = field(default_factory=list)  # most sampled MainThread stack, root first (64 leaf-most frames)

    def share(self, cls: str) -> float:
        """Fraction of all samples in class `cls`."""
        return self.class_samples.get(cls, 0) / self.samples if self.samples else 0.0

    def busy_shares(self) -> dict[str, float]:
        """Shares of the non-idle samples: what the process spends its working time on."""
        busy = {c: n for c, n in self.class_samples.items() if c != IDLE}
        total = sum(busy.values())
        return {c: n / total for c, n in busy.items()} if total else {}

    @property
    def classified_share(self) -> float:
        """Fraction of samples given a class other than 'other'."""
        return 1.0 - self.share(OTHER)

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON (diagnose) and the store."""
        return {
            "pid": self.pid, "role": self.role, "samples": self.samples,
            "class_shares": {c: round(self.share(c), 4) for c in CLASSES if self.class_samples.get(c)},
            "busy_shares": {c: round(v, 4) for c, v in sorted(self.busy_shares().items(), key=lambda kv: -kv[1])},
            "top_frames": [{"frame": f, "class": c, "samples": n} for f, c, n in self.top_frames],
            "main_thread": self.main_thread,
        }


def split_stack(stack: str) -> tuple[str | None, list[str]]:
    """(thread label or None, frames root first) of one folded stack; 'process N:...' prefixes are dropped.

    'thread (7): MainThread;a (x.py:1);b (y.py:2)' -> ('thread (7): MainThread', ['a (x.py:1)', 'b (y.py:2)'])
    """
    parts = stack.split(";")
    thread = None
    while parts and (parts[0].startswith("thread (") or parts[0].startswith("process ")):
        head = parts.pop(0)
        if head.startswith("thread ("):
            thread = head
    return thread, parts


def summarize(stacks: dict[str, int], pid: int = 0, role: str = "", top: int = 10,
              active: bool | None = None) -> ProcessProfile:
    """Summarise folded stacks ({'thread (1): MainThread;a (x.py:1);b (y.py:2)': 5}) of one process.

    `active=True` says every sample was of a running thread (a record without --idle); a dump's
    thread labels end in '[active]' or '[idle]' and say it per thread.
    """
    class_samples: Counter[str] = Counter()
    frame_counts: Counter[tuple[str, str]] = Counter()
    main: Counter[tuple[str, ...]] = Counter()
    for stack, count in stacks.items():
        thread, frames = split_stack(stack)
        known = active
        if thread is not None and thread.endswith("[active]"):
            known = True
        elif thread is not None and thread.endswith("[idle]"):
            known = False
        cls = classify_stack(frames, known)
        class_samples[cls] += count
        frame_counts[(anchor_frame(frames), cls)] += count
        if thread is None or ": MainThread" in thread:
            main[tuple(frames)] += count
    # busy work first: an operator asks what the process does, then what it waits on
    ranked = sorted(frame_counts.items(), key=lambda kv: (kv[0][1] == IDLE, -kv[1], kv[0][0]))
    top_frames = [(f, c, n) for (f, c), n in ranked[:top] if f]
    main_stack = list(main.most_common(1)[0][0]) if main else []
    return ProcessProfile(pid=pid, role=role, samples=sum(stacks.values()), class_samples=dict(class_samples),
                          top_frames=top_frames, main_thread=main_stack[-64:])
