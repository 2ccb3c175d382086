"""The scheduler model: hand-computed cases, preemption, priority, and its fast path against a step-by-step reference."""

from __future__ import annotations

import bisect
import json
import math
import random
from collections import Counter

import numpy as np
import pytest

from vllm_sentinel.agent.diagnosis import sim_scheduler
from vllm_sentinel.agent.diagnosis.sim_results import SimResult, weighted_quantile
from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig, SimRequest, StepTime, simulate

ONE_SECOND = StepTime(base_s=1.0, per_prefill_token_s=0.0, per_decode_seq_s=0.0)


def cfg(**kw) -> EngineConfig:
    base = dict(max_num_seqs=8, max_num_batched_tokens=32, num_blocks=1001, block_size=16, max_model_len=1024)
    return EngineConfig(**{**base, **kw})


def itl_list(r: SimResult) -> list[float]:
    return sorted(np.repeat(r.itl_values, r.itl_counts).tolist())


# ---- hand-computed cases

def test_one_request_alone_prefills_in_budget_sized_chunks_then_decodes_one_token_a_step():
    st = StepTime(base_s=0.01, per_prefill_token_s=0.001, per_decode_seq_s=0.002)
    r = simulate([SimRequest(0.0, 100, 5)], cfg(), st)
    # ceil(100 / 32) = 4 prefill steps (32, 32, 32, 4 tokens), the first token at the end of the 4th
    assert r.ttft_s[0] == pytest.approx(3 * (0.01 + 0.032) + (0.01 + 0.004))
    assert r.e2e_s[0] == pytest.approx(r.ttft_s[0] + 4 * 0.012)
    assert r.queue_s[0] == 0.0
    assert r.steps == 8 and r.tokens_per_step == {32: 3, 4: 1, 1: 4}
    assert itl_list(r) == pytest.approx([0.012] * 4)
    assert r.quantile("tpot", 0.5) == pytest.approx(0.012)
    assert r.finished.all() and r.total_preemptions == 0 and r.generated_tokens == 5


def test_context_tokens_are_computed_plus_scheduled_tokens():
    st = StepTime(base_s=1.0, per_prefill_token_s=0.0, per_decode_seq_s=0.0, per_context_token_s=0.01)
    r = simulate([SimRequest(0.0, 10, 3)], cfg(), st)
    # steps attend to 10, 11 and 12 tokens
    assert r.ttft_s[0] == pytest.approx(1.10)
    assert r.e2e_s[0] == pytest.approx(1.10 + 1.11 + 1.12)
    assert itl_list(r) == pytest.approx([1.11, 1.12])


def test_with_one_seat_the_second_request_queues_until_the_first_finishes():
    r = simulate([SimRequest(0.0, 10, 3), SimRequest(0.5, 10, 3)], cfg(max_num_seqs=1), ONE_SECOND)
    assert r.e2e_s[0] == 3.0
    assert r.queue_s[1] == pytest.approx(2.5)  # first scheduled at 3 s
    assert r.ttft_s[1] == pytest.approx(3.5) and r.e2e_s[1] == pytest.approx(5.5)


def test_a_long_prompt_is_chunked_with_what_the_running_decodes_leave_of_the_budget():
    reqs = [SimRequest(0.0, 4, 10), SimRequest(0.5, 100, 2)]
    r = simulate(reqs, cfg(), ONE_SECOND)
    # B is seen at 1 s: 31 + 31 + 31 + 7 tokens beside A's decodes, its first token at 5 s
    assert r.queue_s[1] == pytest.approx(0.5)
    assert r.ttft_s[1] == pytest.approx(4.5)
    assert r.tokens_per_step[32] == 3 and r.tokens_per_step[8] == 1 and r.tokens_per_step[4] == 1


def test_long_prefill_token_threshold_caps_each_chunk():
    r = simulate([SimRequest(0.0, 100, 1)], cfg(max_num_batched_tokens=64, long_prefill_token_threshold=24),
                 ONE_SECOND)
    assert r.ttft_s[0] == 5.0  # 24, 24, 24, 24, 4
    assert r.tokens_per_step == {24: 4, 4: 1}


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room_for_all_of_it():
    reqs = [SimRequest(0.0, 100, 3), SimRequest(0.0, 100, 3)]
    whole = simulate(reqs, cfg(max_num_batched_tokens=128, max_model_len=128, chunked_prefill=False), ONE_SECOND)
    chunked = simulate(reqs, cfg(max_num_batched_tokens=128, max_model_len=128), ONE_SECOND)
    assert whole.queue_s[1] == 1.0 and whole.tokens_per_step[100] == 1 and whole.tokens_per_step[101] == 1
    assert chunked.queue_s[1] == 0.0 and chunked.tokens_per_step[128] == 1  # 100 + 28 in the first step


def test_kv_pressure_preempts_the_last_running_request_which_recomputes_prompt_and_output():
    # 6 usable blocks of 4 tokens; each request ends at 16 tokens (4 blocks), so both cannot finish together
    reqs = [SimRequest(0.0, 8, 9), SimRequest(0.0, 8, 9)]
    r = simulate(reqs, cfg(num_blocks=7, block_size=4, max_num_batched_tokens=64), ONE_SECOND)
    assert r.finished.all()
    assert list(r.preemptions) == [0, 1] and r.total_preemptions == 1
    assert r.peak_blocks <= 6
    # A needs its 4th block in step 5 and takes B's; B comes back after A finishes at 9 s and recomputes 8 + 5 tokens
    assert r.e2e_s[0] == 9.0 and r.e2e_s[1] == 13.0
    assert r.tokens_per_step == {16: 1, 2: 4, 1: 7, 13: 1}
    assert max(itl_list(r)) == 5.0  # B's token before the preemption came out at 5 s, the next at 10 s
    assert r.preemptions_per_s() == pytest.approx(1 / 13)


def test_a_chunked_prompt_waits_until_its_whole_sequence_fits():
    """vLLM (scheduler_reserve_full_isl) admits a request only where all its tokens so far fit in the free
    blocks, though it allocates one chunk: admitted on its first chunk's block, the prompt would be preempted
    at its next block and recomputed again and again."""
    # 6 usable blocks of 16 tokens; A holds 3 (40 tokens growing to 44); B's 60-token prompt needs 4, its first
    # chunk 1. B waits for A to finish, then prefills in 2 steps (48 + 12 tokens) with nothing preempted
    reqs = [SimRequest(0.0, 40, 4), SimRequest(0.0, 60, 1)]
    r = simulate(reqs, cfg(num_blocks=7, max_num_batched_tokens=48), ONE_SECOND)
    assert r.finished.all() and r.total_preemptions == 0
    assert r.queue_s[1] == pytest.approx(r.e2e_s[0]) and r.ttft_s[1] == pytest.approx(r.e2e_s[0] + 2.0)


def test_priority_admits_by_priority_and_preempts_the_largest_priority_value():
    reqs = [SimRequest(0.0, 10, 3, priority=0), SimRequest(0.1, 10, 3, priority=5), SimRequest(0.2, 10, 3, priority=1)]
    fcfs = simulate(reqs, cfg(max_num_seqs=1), ONE_SECOND)
    prio = simulate(reqs, cfg(max_num_seqs=1, policy="priority"), ONE_SECOND)
    assert fcfs.e2e_s[1] + 0.1 < fcfs.e2e_s[2] + 0.2
    assert prio.e2e_s[2] + 0.2 < prio.e2e_s[1] + 0.1

    pressed = [SimRequest(0.0, 8, 9, priority=1), SimRequest(0.5, 8, 9, priority=0)]
    small = dict(num_blocks=7, block_size=4, max_num_batched_tokens=64)
    assert list(simulate(pressed, cfg(**small), ONE_SECOND).preemptions) == [0, 1]
    r = simulate(pressed, cfg(**small, policy="priority"), ONE_SECOND)
    # A is first in the running list but has the larger priority value: it is the victim; being the request
    # scheduled, scheduling stops with nothing scheduled, which costs no time, and B goes on at once
    assert list(r.preemptions) == [1, 0] and r.finished.all()
    assert r.e2e_s[1] == 9.5 and max(itl_list(r)) == 6.0 and r.steps == 14


def test_tied_arrivals_under_priority_do_not_preempt_each_other_forever():
    # vLLM's victim key (priority, arrival) ties here; the later request in the input yields
    reqs = [SimRequest(0.0, 100, 60)] * 3
    c = cfg(max_num_seqs=3, max_num_batched_tokens=200, num_blocks=180, block_size=1,
            long_prefill_token_threshold=24, policy="priority")
    r = simulate(reqs, c, ONE_SECOND)
    assert r.finished.all() and list(r.e2e_s) == [64.0, 128.0, 192.0]


def test_a_closed_loop_sends_each_clients_next_request_when_its_last_one_returns():
    reqs = [SimRequest(0.0, 10, 3), SimRequest(0.0, 10, 3), SimRequest(0.0, 2000, 3), SimRequest(0.0, 10, 3),
            SimRequest(0.0, 10, 3)]
    r = simulate(reqs, cfg(), ONE_SECOND, clients=2)
    # the two first return at 3 s; the third is refused (too long), so that client sends the fourth at once
    assert list(r.arrival_s) == [0.0, 0.0, 3.0, 3.0, 3.0] and list(r.rejected) == [False, False, True, False, False]
    assert list(r.e2e_s[[0, 1, 3, 4]]) == [3.0] * 4
    cut = simulate(reqs, cfg(), ONE_SECOND, horizon_s=2.0, clients=2)
    assert cut.arrived == 2 and np.isnan(cut.arrival_s[2:]).all() and not cut.finished.any()


def test_cached_prefix_counts_in_whole_blocks_and_only_on_first_admission():
    r = simulate([SimRequest(0.0, 100, 1, cached_tokens=40)], cfg(max_num_batched_tokens=64), ONE_SECOND)
    assert r.tokens_per_step == {64: 1, 4: 1}  # 40 cached -> 32 (2 blocks), 68 to compute


def test_rejected_requests_are_counted_and_the_rest_served():
    reqs = [SimRequest(0.0, 1000, 100), SimRequest(0.0, 100, 50), SimRequest(0.0, 10, 5)]
    r = simulate(reqs, cfg(max_model_len=1024, num_blocks=6), ONE_SECOND)  # 5 blocks = 80 tokens
    assert list(r.rejected) == [True, True, False] and r.num_rejected == 2
    assert list(r.finished) == [False, False, True]
    assert r.attainment(None, None) == pytest.approx(1 / 3)


def test_horizon_stops_the_engine_and_leaves_requests_unfinished():
    reqs = [SimRequest(0.0, 10, 100), SimRequest(5.0, 10, 2), SimRequest(50.0, 10, 2)]
    r = simulate(reqs, cfg(), ONE_SECOND, horizon_s=20.0)
    assert list(r.finished) == [False, True, False] and r.span_s == 20.0 and r.arrived == 2
    assert r.steps == 20 and math.isnan(r.e2e_s[0]) and math.isnan(r.queue_s[2])


# ---- results

def result_of(ttft, e2e, out, finished) -> SimResult:
    n = len(ttft)
    return SimResult(
        arrival_s=np.zeros(n), prompt_tokens=np.ones(n, dtype=np.int64), output_tokens=np.array(out),
        queue_s=np.zeros(n), ttft_s=np.array(ttft, dtype=float), e2e_s=np.array(e2e, dtype=float),
        preemptions=np.zeros(n, dtype=np.int64), finished=np.array(finished), rejected=np.zeros(n, dtype=bool),
        itl_values=np.array([0.1, 0.2]), itl_counts=np.array([3, 1]), total_preemptions=2, steps=10,
        tokens_per_step={1: 10}, span_s=10.0, busy_s=8.0, peak_blocks=4, arrived=n, generated_tokens=12,
        prompt_tokens_served=n)


def test_quantiles_are_observed_values_per_request_and_per_token():
    r = result_of([1, 2, 3, 4, np.nan], [2, 4, 9, 4, np.nan], [3, 3, 4, 1, 5], [True] * 4 + [False])
    assert r.quantile("ttft", 0.5) == 2.0 and r.quantile("ttft", 0.95) == 4.0 and r.quantile("ttft", 0.0) == 1.0
    assert r.quantile("itl", 0.5) == 0.1 and r.quantile("itl", 0.75) == 0.1 and r.quantile("itl", 0.95) == 0.2
    assert r.quantile("tpot", 1.0) == 2.0  # (9 - 3) / 3; the 1-token request has none
    assert weighted_quantile(np.arange(20.0), np.ones(20, dtype=np.int64), 0.95) == 18.0
    empty = result_of([np.nan], [np.nan], [2], [False])
    assert empty.quantile("ttft", 0.5) is None and empty.quantile("e2e", 0.95) is None
    with pytest.raises(ValueError, match="unknown signal"):
        r.quantile("latency", 0.5)


def test_goodput_and_attainment_count_requests_meeting_every_objective():
    r = result_of([1, 2, 3, 4, np.nan], [2, 4, 9, 4, np.nan], [3, 3, 4, 1, 5], [True] * 4 + [False])
    # tpot: 0.5, 1.0, 2.0, none
    assert r.goodput(None, None) == pytest.approx(0.4)
    assert r.goodput(2.5, None) == pytest.approx(0.2)
    assert r.goodput(None, 1.0) == pytest.approx(0.3)  # the one-token request passes the ITL objective
    assert r.goodput(4.0, 1.0, e2e_slo_s=3.0) == pytest.approx(0.1)
    assert r.attainment(10.0, 10.0) == pytest.approx(0.8)  # the unfinished one misses
    assert r.throughput() == {"requests_per_s": 0.4, "generated_tokens_per_s": 1.2, "prompt_tokens_per_s": 0.5}
    d = r.as_dict()
    assert d["ttft_s"] == {"p50": 2.0, "p95": 4.0} and d["itl_s"]["p50"] == 0.1 and d["preemptions_per_s"] == 0.2
    assert json.loads(json.dumps(d)) == d
    assert weighted_quantile(np.arange(1.0, 101.0), np.ones(100, dtype=np.int64), 0.07) == 7.0


# ---- bad input

@pytest.mark.parametrize("make, words", [
    (lambda: SimRequest(0.0, -5, 10), "prompt_tokens"),
    (lambda: SimRequest(0.0, 5, 0), "output_tokens"),
    (lambda: SimRequest(-1.0, 5, 1), "arrival_s"),
    (lambda: SimRequest(0.0, 5, 1, cached_tokens=5), "cached_tokens"),
    (lambda: cfg(max_num_seqs=0), "max_num_seqs"),
    (lambda: cfg(policy="lifo"), "policy"),
    (lambda: cfg(num_blocks=1), "num_blocks"),
    (lambda: cfg(max_num_batched_tokens=4), "max_num_batched_tokens"),
    (lambda: cfg(chunked_prefill=False), "chunked prefill"),
    (lambda: StepTime(0.0, 0.001, 0.001), "base_s"),
    (lambda: StepTime(0.01, -0.001, 0.001), "per_prefill_token_s"),
    (lambda: simulate([], cfg(), ONE_SECOND, horizon_s=0), "horizon_s"),
    (lambda: simulate([], cfg(), ONE_SECOND, clients=0), "clients"),
])
def test_bad_input_is_a_one_line_value_error_naming_the_problem_and_the_fix(make, words):
    with pytest.raises(ValueError) as e:
        make()
    message = str(e.value)
    assert words in message and "\n" not in message and ":" in message


# ---- the fast path against a plain step-by-step reference

class Reference:
    """The scheduler as specified, one step and one request at a time, checking the block pool every step."""

    def __init__(self, requests, c: EngineConfig, st: StepTime, horizon_s=None, clients=None) -> None:
        self.reqs, self.c, self.st = requests, c, st
        self.cap = c.num_blocks - c.reserved_blocks
        self.horizon = math.inf if horizon_s is None else horizon_s
        n = len(requests)
        self.out = {k: [math.nan] * n for k in ("queue", "ttft", "e2e")}
        self.out.update(pre=[0] * n, itl=[], steps=0, tokens=Counter(), peak=0)
        self.s = [dict(c=0, g=0, held=0, last=0.0, admitted=False) for _ in requests]
        self.arrival = [math.nan] * n
        self.out["rejected"] = [False] * n
        self.pending: list[int] = []  # sent, by arrival
        self.unsent = list(range(n)) if clients else []
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.clock = 0.0
        if clients is None:
            for i in range(n):
                self.send(i, requests[i].arrival_s)
        else:
            for _ in range(clients):
                self.client_free(0.0)

    def send(self, i: int, at: float) -> bool:
        r = self.reqs[i]
        self.arrival[i] = at
        if r.prompt_tokens + r.output_tokens > self.c.max_model_len or \
                self.blocks(r.prompt_tokens + r.output_tokens - 1) > self.cap:
            self.out["rejected"][i] = True
            return False
        bisect.insort(self.pending, i, key=lambda j: (self.arrival[j], j))
        return True

    def client_free(self, at: float) -> None:
        while self.unsent:
            i = self.unsent.pop(0)
            if self.send(i, max(at, self.reqs[i].arrival_s)):
                return

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.c.block_size)

    def used(self) -> int:
        return sum(x["held"] for x in self.s)

    def key(self, i: int):
        return self.reqs[i].priority, self.arrival[i], i

    def chunk(self, num: int, budget: int) -> int:
        """Tokens scheduled out of num; 0 when it does not fit whole without chunked prefill."""
        if not self.c.chunked_prefill:
            return num if num <= budget else 0
        thr = self.c.long_prefill_token_threshold
        return min(num if thr == 0 else min(num, thr), budget)

    def run(self) -> dict:
        while True:
            while self.pending and self.arrival[self.pending[0]] <= self.clock:
                self.waiting.append(self.pending.pop(0))
            if not self.running and not self.waiting:
                if not self.pending or self.arrival[self.pending[0]] >= self.horizon:
                    return self.out
                self.clock = self.arrival[self.pending[0]]
                continue
            if self.clock >= self.horizon:
                return self.out
            sched, budget, preempted = self.schedule_running()
            if not preempted:
                self.admit(sched, budget)
            if not sched:
                assert preempted  # the request tried preempted itself: no forward pass, schedule again
                continue
            assert self.used() <= self.cap
            self.out["peak"] = max(self.out["peak"], self.used())
            self.execute(sched)

    def schedule_running(self):
        budget, sched, preempted, idx = self.c.max_num_batched_tokens, {}, False, 0
        while idx < len(self.running) and budget > 0:
            i = self.running[idx]
            x = self.s[i]
            num = self.chunk(self.reqs[i].prompt_tokens + x["g"] - x["c"], budget)
            if not num:
                idx += 1
                continue
            while self.blocks(x["c"] + num) - x["held"] > self.cap - self.used():
                victim = self.running[-1] if self.c.policy == "fcfs" else max(self.running, key=self.key)
                self.running.remove(victim)
                if victim in sched:
                    budget += sched.pop(victim)
                    idx -= 1
                self.s[victim].update(held=0, c=0)
                self.out["pre"][victim] += 1
                self.waiting.insert(0, victim)
                preempted = True
                if victim == i:
                    return sched, budget, preempted
            x["held"] = self.blocks(x["c"] + num)
            sched[i] = num
            budget -= num
            idx += 1
        return sched, budget, preempted

    def admit(self, sched: dict, budget: int) -> None:
        if self.c.policy == "priority":
            self.waiting.sort(key=self.key)
        while self.waiting and budget > 0 and len(self.running) < self.c.max_num_seqs:
            i = self.waiting[0]
            r, x = self.reqs[i], self.s[i]
            start = 0 if x["admitted"] else r.cached_tokens // self.c.block_size * self.c.block_size
            num = self.chunk(r.prompt_tokens + x["g"] - start, budget)
            # admitted only where the whole sequence so far fits (vLLM's scheduler_reserve_full_isl)
            whole = self.blocks(min(r.prompt_tokens + x["g"], self.c.max_model_len)) - start // self.c.block_size
            if not num or max(self.blocks(start + num), whole) > self.cap - self.used():
                return
            self.waiting.pop(0)
            if not x["admitted"]:
                x["admitted"] = True
                self.out["queue"][i] = self.clock - self.arrival[i]
            x.update(c=start, held=self.blocks(start + num))
            self.running.append(i)
            sched[i] = num
            budget -= num

    def execute(self, sched: dict) -> None:
        prefill = decodes = context = 0
        for i, num in sched.items():
            x = self.s[i]
            context += x["c"] + num
            if x["g"] >= 1 and self.reqs[i].prompt_tokens + x["g"] - x["c"] == 1:
                decodes += 1
            else:
                prefill += num
        self.clock += self.st.seconds(prefill, decodes, context)
        self.out["steps"] += 1
        self.out["tokens"][sum(sched.values())] += 1
        for i, num in sched.items():
            r, x = self.reqs[i], self.s[i]
            x["c"] += num
            if x["c"] < r.prompt_tokens + x["g"]:
                continue
            if x["g"] == 0:
                self.out["ttft"][i] = self.clock - self.arrival[i]
            else:
                self.out["itl"].append(self.clock - x["last"])
            x["g"] += 1
            x["last"] = self.clock
            if x["g"] == r.output_tokens:
                self.out["e2e"][i] = self.clock - self.arrival[i]
                x["held"] = 0
                self.running.remove(i)
                self.client_free(self.clock)


def reference(requests, c: EngineConfig, st: StepTime, horizon_s=None, clients=None) -> dict:
    out = Reference(requests, c, st, horizon_s, clients)
    return {**out.run(), "arrival": out.arrival}


def random_case(seed: int):
    rng = random.Random(seed)
    bs = rng.choice([1, 4, 16])
    chunked = rng.random() < 0.7
    max_len = 512
    budget = rng.choice([16, 48, 200]) if chunked else rng.choice([512, 700])
    c = EngineConfig(
        max_num_seqs=rng.choice([1, 3, 8, 16]), max_num_batched_tokens=budget,
        num_blocks=rng.choice([40, 120, 400, 5000]) // bs + 2, block_size=bs, max_model_len=max_len,
        chunked_prefill=chunked, long_prefill_token_threshold=rng.choice([0, 0, 24]) if chunked else 0,
        policy=rng.choice(["fcfs", "priority"]))
    st = StepTime(0.01, rng.choice([0.0, 2e-4]), rng.choice([0.0, 1e-3]), rng.choice([0.0, 1e-5, 3e-4]))
    # whole-second arrivals and step times in powers of 2 put arrivals exactly on step starts, and tie them
    ties = rng.random() < 0.25
    if ties:
        st = StepTime(rng.choice([1.0, 0.5, 0.25]), 0.0, rng.choice([0.0, 0.25]))
    t, reqs = 0.0, []
    for _ in range(rng.randint(5, 60)):
        t += rng.expovariate(rng.choice([2.0, 20.0]))
        prompt = rng.randint(1, 300)
        reqs.append(SimRequest(float(round(t)) if ties else t, prompt, rng.randint(1, 150),
                               cached_tokens=rng.choice([0, prompt // 2]), priority=rng.randint(0, 2)))
    horizon = rng.choice([None, None, round(t / 2) + 1.0])
    return reqs, c, st, horizon


@pytest.mark.parametrize("seed", range(120))
def test_the_fast_path_serves_random_workloads_exactly_as_the_reference(seed):
    reqs, c, st, horizon = random_case(seed)
    # every fourth case a closed loop, its clients sending the same requests as earlier ones return
    clients = random.Random(seed).choice([1, 2, 5, 12]) if seed % 4 == 3 else None
    fast = simulate(reqs, c, st, horizon_s=horizon, clients=clients)
    ref = reference(reqs, c, st, horizon, clients)
    for name, got in (("arrival", fast.arrival_s), ("queue", fast.queue_s), ("ttft", fast.ttft_s),
                      ("e2e", fast.e2e_s)):
        np.testing.assert_allclose(got, ref[name], rtol=1e-9, atol=1e-9, equal_nan=True, err_msg=name)
    assert list(fast.preemptions) == ref["pre"] and list(fast.rejected) == ref["rejected"]
    assert fast.steps == ref["steps"] and fast.tokens_per_step == dict(ref["tokens"])
    assert fast.peak_blocks == ref["peak"] <= c.num_blocks - c.reserved_blocks
    np.testing.assert_allclose(itl_list(fast), sorted(ref["itl"]), rtol=1e-9, atol=1e-9)


def test_the_random_cases_cover_preemption_both_policies_and_chunked_prefill_on_and_off():
    seen = Counter()
    for seed in range(120):
        reqs, c, st, horizon = random_case(seed)
        r = simulate(reqs, c, st, horizon_s=horizon)
        seen[(c.policy, c.chunked_prefill, r.total_preemptions > 0)] += 1
    assert all(seen[(p, ch, True)] >= 2 for p in ("fcfs", "priority") for ch in (True, False))


def test_steady_decode_is_advanced_many_steps_at_a_time(monkeypatch):
    skips = []
    real = sim_scheduler._Engine._skip

    def counting(self):
        steps = self.tally.steps
        took = real(self)
        if took:
            skips.append(self.tally.steps - steps)
        return took

    monkeypatch.setattr(sim_scheduler._Engine, "_skip", counting)
    reqs = [SimRequest(i * 0.01, 50, 400) for i in range(20)]
    r = simulate(reqs, cfg(max_num_seqs=32, max_num_batched_tokens=2048), StepTime(0.01, 1e-5, 1e-4, 1e-7))
    assert r.finished.all() and max(skips) > 100 and len(skips) < 40
