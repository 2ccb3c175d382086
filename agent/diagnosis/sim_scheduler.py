"""A discrete-event model of vLLM V1's scheduler, to replay a recorded workload under another configuration.

One `schedule()` per engine step as vLLM V1 does it: running requests first, in running order, preempting
on a KV block shortage (fcfs: the last running request; priority: the largest (priority, arrival)), then
waiting requests while no request was preempted in the step; every step costs a linear StepTime.
Left out: blocks shared between requests by the prefix cache (each request holds its cached prefix),
prefix hits for a recomputed request, speculative decoding and asynchronous scheduling.

Two things keep an hour of one instance's traffic to a fraction of a second of CPU:
- requests in steady decode form a cohort whose tokens and blocks follow from the step number, so a step
  costs O(requests not in steady decode), not O(running requests);
- a stretch where only the cohort decodes and nothing can change (no admission, no finish, enough free
  blocks) is advanced in one go: its step times grow by an arithmetic series as the context grows.
"""

from __future__ import annotations

import heapq
import math
import sys
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from vllm_sentinel.agent.diagnosis.sim_results import SimResult, SimTally

POLICIES = ("fcfs", "priority")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class SimRequest:
    """One request of a workload: when it arrived, what it reads and writes, and what the prefix cache serves."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    priority: int = 0

    def __post_init__(self) -> None:
        _require(math.isfinite(self.arrival_s) and self.arrival_s >= 0,
                 f"arrival_s is {self.arrival_s}: give seconds from the start of the window (>= 0)")
        _require(self.prompt_tokens >= 1, f"prompt_tokens is {self.prompt_tokens}: a request reads at least 1 token")
        _require(self.output_tokens >= 1, f"output_tokens is {self.output_tokens}: a request writes at least 1 token")
        _require(0 <= self.cached_tokens < self.prompt_tokens,
                 f"cached_tokens is {self.cached_tokens} for a {self.prompt_tokens}-token prompt: "
                 "keep it in [0, prompt_tokens - 1] (vLLM always computes the last prompt token)")


@dataclass(frozen=True)
class EngineConfig:
    """The scheduler and KV cache settings of one vLLM instance."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_blocks: int
    block_size: int
    max_model_len: int
    chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    reserved_blocks: int = 1

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, f"max_num_seqs is {self.max_num_seqs}: set --max-num-seqs to 1 or more")
        _require(self.max_num_batched_tokens >= self.max_num_seqs,
                 f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below max_num_seqs "
                 f"({self.max_num_seqs}), which vLLM refuses: raise --max-num-batched-tokens or lower --max-num-seqs")
        _require(self.block_size >= 1, f"block_size is {self.block_size}: give vLLM's tokens per block (16, 128)")
        _require(self.reserved_blocks >= 0, f"reserved_blocks is {self.reserved_blocks}: use 1 (vLLM's null block)")
        _require(self.num_blocks > self.reserved_blocks,
                 f"num_blocks is {self.num_blocks} with {self.reserved_blocks} reserved, leaving no KV block: "
                 "give the num_gpu_blocks vLLM logs")
        _require(self.max_model_len >= 2, f"max_model_len is {self.max_model_len}: give --max-model-len (>= 2)")
        _require(self.long_prefill_token_threshold >= 0, f"long_prefill_token_threshold is "
                 f"{self.long_prefill_token_threshold}: use 0 for no cap or a positive token count")
        _require(self.policy in POLICIES, f"policy {self.policy!r} is unknown: use 'fcfs' or 'priority'")
        _require(self.chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
                 f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must cover "
                 f"max_model_len ({self.max_model_len}), as vLLM requires: raise it or enable chunked prefill")


@dataclass(frozen=True)
class StepTime:
    """Seconds one engine step takes: fixed, per prompt token computed, per decode sequence, per context token read."""

    base_s: float
    per_prefill_token_s: float
    per_decode_seq_s: float
    per_context_token_s: float = 0.0

    def __post_init__(self) -> None:
        _require(math.isfinite(self.base_s) and self.base_s > 0,
                 f"base_s is {self.base_s}: every engine step costs time, give a positive fixed cost")
        for name in ("per_prefill_token_s", "per_decode_seq_s", "per_context_token_s"):
            v = getattr(self, name)
            _require(math.isfinite(v) and v >= 0, f"{name} is {v}: give a cost >= 0 seconds")

    def seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """The duration of a step with this much work."""
        return (self.base_s + self.per_prefill_token_s * prefill_tokens + self.per_decode_seq_s * decode_seqs
                + self.per_context_token_s * context_tokens)


def simulate(requests: Sequence[SimRequest], config: EngineConfig, step_time: StepTime,
             horizon_s: float | None = None, *, clients: int | None = None) -> SimResult:
    """Serve the requests on one simulated engine; no step starts at or after horizon_s (None: until all finish).

    clients: a closed loop rather than the arrival times: that many clients send the requests in order, each
    its next one when its last one finished or was rejected (arrival_s is then the earliest a request goes).
    """
    _require(horizon_s is None or horizon_s > 0, f"horizon_s is {horizon_s}: give a window length > 0 or None")
    _require(clients is None or clients >= 1, f"clients is {clients}: give 1 or more, or None to use arrival_s")
    engine = _Engine(requests, config, step_time, horizon_s, clients)
    engine.run()
    return engine.result()


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class _Seq:
    """A request inside the engine; computed/generated/held are current only while it is outside the cohort."""

    __slots__ = ("idx", "prompt", "output", "cached", "priority", "arrival", "computed", "generated", "held",
                 "last_token_s", "order", "admitted", "c_join", "g_join", "t_join")

    def __init__(self, idx: int, r: SimRequest, block_size: int, arrival: float) -> None:
        self.idx, self.prompt, self.output, self.priority, self.arrival = (
            idx, r.prompt_tokens, r.output_tokens, r.priority, arrival)
        self.cached = r.cached_tokens // block_size * block_size  # the prefix cache hits whole blocks only
        self.computed = self.generated = self.held = self.c_join = self.g_join = self.order = 0
        self.last_token_s, self.admitted = 0.0, False
        self.t_join = -1  # the step it joined the decode cohort at; -1 outside it


def _write_out(seq: _Seq, tick: int) -> None:
    """A cohort member's tokens at step `tick`, kept on the request as it leaves the cohort."""
    done = tick - seq.t_join
    seq.computed, seq.generated, seq.t_join = seq.c_join + done, seq.g_join + done, -1


class _Engine:
    """The scheduler's state between steps, with the decode cohort's aggregates."""

    def __init__(self, requests: Sequence[SimRequest], config: EngineConfig, step_time: StepTime,
                 horizon_s: float | None, clients: int | None) -> None:
        self.requests, self.cfg, self.st = requests, config, step_time
        self.bs, self.budget = config.block_size, config.max_num_batched_tokens
        self.capacity = config.num_blocks - config.reserved_blocks
        self.chunk_cap = config.long_prefill_token_threshold or sys.maxsize
        self.horizon = math.inf if horizon_s is None else horizon_s
        self.tally = SimTally(len(requests))
        self.arrivals: list[tuple[float, int, _Seq]] = []  # a heap of requests sent, not yet seen by a step
        self.unsent = deque(range(len(requests)) if clients else ())  # a closed loop's requests, in order
        if clients is None:
            for i in range(len(requests)):
                self._send(i, requests[i].arrival_s)
        else:
            for _ in range(clients):
                self._client_free(0.0)
        self.pushes = 0
        self.waiting: list[tuple[tuple[float, ...], _Seq]] = []  # a heap on the policy's order
        self.running: dict[int, _Seq] = {}  # by position in the running list
        self.explicit: dict[int, _Seq] = {}  # running requests outside the cohort
        self.clock, self.tick, self.used, self.next_order = 0.0, 0, 0, 0
        self._reset_cohort()

    def _reset_cohort(self) -> None:
        self.n = 0
        self.ctx_base = 0  # sum of (c_join - t_join): the cohort's context in step t is ctx_base + n * (t + 1)
        self.phase = [0] * self.bs  # members needing a new block in the steps t with t % block_size == key
        self.finishes: list[tuple[int, int, _Seq]] = []  # (step of its last token, order, member)
        self.cohort_orders: list[int] = []

    def _send(self, i: int, at: float) -> bool:
        """Request i reaches the server at `at`; False when it is refused outright."""
        r = self.requests[i]
        self.tally.arrival_s[i] = at
        tokens = r.prompt_tokens + r.output_tokens
        # the last output token is never computed, so it needs no KV slot
        if tokens > self.cfg.max_model_len or _blocks(tokens - 1, self.bs) > self.capacity:
            self.tally.rejected[i] = True
            return False
        heapq.heappush(self.arrivals, (at, i, _Seq(i, r, self.bs, at)))
        return True

    def _client_free(self, at: float) -> None:
        """A closed-loop client sends its next request, and the next again while they are refused."""
        while self.unsent:
            i = self.unsent.popleft()
            if self._send(i, max(at, self.requests[i].arrival_s)):
                return

    def run(self) -> None:
        """Step until every request finished, or until the horizon."""
        while True:
            while self.arrivals and self.arrivals[0][0] <= self.clock:
                self._enqueue(heapq.heappop(self.arrivals)[2], front=False)
            if not self.running and not self.waiting:
                if not self.arrivals or self.arrivals[0][0] >= self.horizon:
                    return
                self.clock = self.arrivals[0][0]
            elif self.clock >= self.horizon:
                return
            elif not self._skip():
                self._step()

    def _enqueue(self, seq: _Seq, front: bool) -> None:
        self.pushes += 1
        key = (seq.priority, seq.arrival, seq.idx) if self.cfg.policy == "priority" else \
            (-self.pushes if front else self.pushes,)
        heapq.heappush(self.waiting, (key, seq))

    def _step(self) -> None:
        plan: list[tuple[_Seq, int]] = []
        budget = self._schedule_fast(plan)
        preempted = False
        if budget is None:
            plan.clear()
            budget, preempted = self._schedule_exact(plan)
        if not preempted:
            self._admit(budget, plan)
        if plan or self.n:
            self._run_step(plan)
        elif not preempted:
            raise RuntimeError("the simulated engine scheduled nothing with requests pending (a bug in the model)")
        # else every request it tried preempted itself: vLLM runs no forward pass and schedules again at once

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens a request computes this step out of `remaining` (0: it does not fit whole, unchunked)."""
        if not self.cfg.chunked_prefill:
            return remaining if remaining <= budget else 0
        return min(remaining, self.chunk_cap, budget)

    def _schedule_fast(self, plan: list[tuple[_Seq, int]]) -> int | None:
        """Running requests when every cohort member gets its token and no block runs short; None otherwise."""
        budget, before, n = self.budget, 0, self.n
        grow = self.phase[self.tick % self.bs]
        for order in sorted(self.explicit):
            members = bisect_left(self.cohort_orders, order)
            if members - before > budget:
                return None
            budget, before = budget - (members - before), members
            if budget == 0:
                break
            seq = self.explicit[order]
            num_new = self._chunk(seq.prompt + seq.generated - seq.computed, budget)
            if num_new:
                grow += _blocks(seq.computed + num_new, self.bs) - seq.held
                plan.append((seq, num_new))
                budget -= num_new
        if n - before > budget or grow > self.capacity - self.used:
            return None
        for seq, num_new in plan:
            seq.held = _blocks(seq.computed + num_new, self.bs)
        self.used += grow
        return budget - (n - before)

    def _schedule_exact(self, plan: list[tuple[_Seq, int]]) -> tuple[int, bool]:
        """Running requests one by one, preempting on a block shortage as the engine does; (budget left, preempted)."""
        self._dissolve_cohort()
        run = list(self.running.values())
        budget, i, preempted = self.budget, 0, False
        scheduled: dict[_Seq, int] = {}
        while i < len(run) and budget > 0:
            seq = run[i]
            num_new = self._chunk(seq.prompt + seq.generated - seq.computed, budget)
            if not num_new:
                i += 1
                continue
            grow = _blocks(seq.computed + num_new, self.bs) - seq.held
            while grow > self.capacity - self.used and seq.order in self.running:
                # vLLM's key is (priority, arrival); recorded arrivals can tie, and two tied requests can
                # preempt each other forever, so the later one in the input yields
                victim = run[-1] if self.cfg.policy == "fcfs" else max(run, key=lambda s: (s.priority, s.arrival, s.idx))
                run.remove(victim)
                if victim in scheduled:  # already scheduled this step: its tokens go back to the budget
                    budget += scheduled.pop(victim)
                    i -= 1
                self._preempt(victim)
                preempted = True
            if seq.order not in self.running:
                break  # it was the one preempted
            seq.held += grow
            self.used += grow
            scheduled[seq] = num_new
            budget -= num_new
            i += 1
        plan.extend(scheduled.items())
        return budget, preempted

    def _preempt(self, seq: _Seq) -> None:
        if self.tally.total_preemptions > 1000 * len(self.requests):
            raise RuntimeError("the simulated engine keeps preempting without finishing requests: report the workload")
        self.used -= seq.held
        seq.held = seq.computed = 0
        self.tally.preemptions[seq.idx] += 1
        self.tally.total_preemptions += 1
        del self.running[seq.order], self.explicit[seq.order]
        self._enqueue(seq, front=True)

    def _prefill_plan(self, seq: _Seq, budget: int) -> tuple[int, int, int, int]:
        """(computed tokens it starts from, tokens this step, blocks it takes, free blocks it needs to be admitted)
        for a waiting request; 0 tokens: it cannot.

        vLLM admits a waiting or preempted request only where its whole sequence so far fits in the free
        blocks (scheduler_reserve_full_isl, on by default since 0.32), though it allocates only this step's
        chunk: a chunked prompt is not admitted to be preempted at its next block."""
        start = 0 if seq.admitted else seq.cached  # a recomputed request starts over, cache or not
        total = seq.prompt + seq.generated
        num_new = self._chunk(total - start, budget)
        take = _blocks(start + num_new, self.bs)
        whole = _blocks(min(total, self.cfg.max_model_len), self.bs) - start // self.bs
        return start, num_new, take, max(take, whole)

    def _admit(self, budget: int, plan: list[tuple[_Seq, int]]) -> None:
        free = self.capacity - self.used
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0][1]
            start, num_new, take, need = self._prefill_plan(seq, budget)
            if not num_new or need > free:
                break  # the head stays at the head
            heapq.heappop(self.waiting)
            if not seq.admitted:
                seq.admitted = True
                self.tally.queue_at[seq.idx] = self.clock
                self.tally.queue_tick[seq.idx] = self.tick
            seq.computed, seq.held, seq.order = start, take, self.next_order
            self.next_order += 1
            free -= take
            self.used += take
            self.running[seq.order] = self.explicit[seq.order] = seq
            plan.append((seq, num_new))
            budget -= num_new

    def _run_step(self, plan: list[tuple[_Seq, int]]) -> None:
        """Time one step, then advance every scheduled request; tokens come out at the step's end."""
        n, t = self.n, self.tick
        prefill, decodes, tokens, context = 0, n, n, self.ctx_base + n * (t + 1)
        for seq, num_new in plan:
            context += seq.computed + num_new
            tokens += num_new
            if seq.generated and seq.computed + 1 == seq.prompt + seq.generated:
                decodes += 1
            else:
                prefill += num_new
                if self.tally.preemptions[seq.idx]:
                    self.tally.recomputed += num_new
        step = self.st.seconds(prefill, decodes, context)
        end = self.clock + step
        self.tally.held(t, 1, decodes, prefill)
        self.tally.peak_blocks = max(self.tally.peak_blocks, self.used)
        if n:
            self.tally.latency_run(step, 0.0, 1, n)
        self._finish_cohort(t, end)
        self.tick = t + 1
        for seq, num_new in plan:
            self._advance(seq, num_new, end)
        self.clock = end
        self.tally.stepped(step, tokens)

    def _advance(self, seq: _Seq, num_new: int, end: float) -> None:
        seq.computed += num_new
        if seq.computed < seq.prompt + seq.generated:
            return
        if seq.generated:
            self.tally.token(end - seq.last_token_s)
        else:
            self.tally.first_token_at[seq.idx] = end
            self.tally.first_token_tick[seq.idx] = self.tick  # already past the step that produced it
            self.tally.prompt_served += seq.prompt
            self.tally.generated += 1
        seq.generated += 1
        seq.last_token_s = end
        if seq.generated == seq.output:
            self._finish(seq, end)
        else:
            self._join_cohort(seq)

    def _finish(self, seq: _Seq, end: float) -> None:
        self.used -= _blocks(seq.computed, self.bs)
        seq.held = 0
        self.tally.finished_at[seq.idx] = end
        del self.running[seq.order]
        self.explicit.pop(seq.order, None)
        self._client_free(end)

    def _join_cohort(self, seq: _Seq) -> None:
        seq.t_join, seq.c_join, seq.g_join = self.tick, seq.computed, seq.generated
        self.n += 1
        self.ctx_base += seq.c_join - seq.t_join
        self.phase[(seq.t_join - seq.c_join) % self.bs] += 1
        heapq.heappush(self.finishes, (seq.t_join + seq.output - seq.g_join - 1, seq.order, seq))
        insort(self.cohort_orders, seq.order)
        del self.explicit[seq.order]

    def _finish_cohort(self, t: int, end: float) -> None:
        """Members whose last token comes out of step t leave the cohort and finish."""
        while self.finishes and self.finishes[0][0] == t:
            seq = heapq.heappop(self.finishes)[2]
            self.n -= 1
            self.ctx_base -= seq.c_join - seq.t_join
            self.phase[(seq.t_join - seq.c_join) % self.bs] -= 1
            del self.cohort_orders[bisect_left(self.cohort_orders, seq.order)]
            _write_out(seq, t + 1)
            self._finish(seq, end)

    def _dissolve_cohort(self) -> None:
        """Write every member's state out (its last token came out at the previous step's end: now)."""
        for seq in self.running.values():
            if seq.t_join >= 0:
                _write_out(seq, self.tick)
                seq.held, seq.last_token_s = _blocks(seq.computed, self.bs), self.clock
                self.explicit[seq.order] = seq
        self._reset_cohort()

    def _skip(self) -> bool:
        """Advance a stretch of cohort-only decode steps at once when nothing else can happen in it."""
        n, t = self.n, self.tick
        if self.explicit or not n:
            return False
        free = self.capacity - self.used
        first = self.phase[t % self.bs]
        left = self.budget - n
        room = left > 0 and len(self.running) < self.cfg.max_num_seqs
        if first > free:
            return False
        if room and self.waiting:
            _, num_new, _take, need = self._prefill_plan(self.waiting[0][1], left)
            if num_new and need <= free - first:
                return False
        limit = self.horizon
        # a blocked fcfs head stays blocked (free blocks only shrink, the budget left stays); an arrival
        # can be admitted, or under priority jump the queue, only where there is room
        if room and (not self.waiting or self.cfg.policy == "priority") and self.arrivals:
            limit = min(limit, self.arrivals[0][0])
        d0 = self.st.seconds(0, n, self.ctx_base + n * (t + 1))
        growth = self.st.per_context_token_s * n
        k = _steps_starting_before(self.clock, d0, growth, limit, self.finishes[0][0] - t + 1)
        k, blocks = self._steps_within_blocks(free, k)
        span = k * d0 + growth * k * (k - 1) / 2
        self.tally.latency_run(d0, growth, k, n)
        self.tally.held(t, k, n, 0)
        self.used += blocks
        self.tally.peak_blocks = max(self.tally.peak_blocks, self.used)
        self._finish_cohort(t + k - 1, self.clock + span)
        self.clock, self.tick = self.clock + span, t + k
        self.tally.stepped(span, n, k)
        return True

    def _steps_within_blocks(self, free: int, cap: int) -> tuple[int, int]:
        """The most steps (<= cap) whose new blocks fit in `free`, and the blocks they take."""
        n, bs = self.n, self.bs
        r = self.tick % bs
        prefix = list(accumulate(self.phase[r:] + self.phase[:r], initial=0))  # each member crosses once per bs steps
        cycles = min(cap // bs, free // n)
        extra = min(bisect_right(prefix, free - cycles * n) - 1, cap - cycles * bs)
        return cycles * bs + extra, cycles * n + prefix[extra]

    def result(self) -> SimResult:
        """The tallies as a SimResult."""
        span = self.clock if self.horizon == math.inf else max(self.clock, self.horizon)
        return self.tally.result(self.requests, span, self.horizon)


def _steps_starting_before(t0: float, d0: float, growth: float, limit: float, cap: int) -> int:
    """How many of the steps starting at t0, lasting d0, d0 + growth, ... start before `limit` (1..cap)."""
    if limit == math.inf:
        return cap

    def start(j: int) -> float:
        return t0 + j * d0 + growth * j * (j - 1) / 2

    # start(j) = limit solves a j^2 + b j = limit - t0; the steps before it are those with j below the root
    a, b, gap = growth / 2, d0 - growth / 2, limit - t0
    root = gap / b if a == 0 else (-b + math.sqrt(b * b + 4 * a * gap)) / (2 * a)
    k = max(1, min(cap, math.ceil(root)))
    while k < cap and start(k) < limit:
        k += 1
    while k > 1 and start(k - 1) >= limit:
        k -= 1
    return k

