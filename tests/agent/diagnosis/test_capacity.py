"""`capacity` on DuckDB files: a generated history with known load steps, and the recorded real session.

The generated history is OpenMetrics text with timestamps, ingested like a customer's dump: four
load steps, each holding its request rate and its latencies (every request of a step observed at
the step's values), so every figure capacity reports follows from the steps and vLLM's bucket bounds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.daemon.routes import daemon_route_capacity
from vllm_sentinel.agent.diagnosis.capacity import CapacityQuery, NoLoadInWindow, capacity, clamp_to_data
from vllm_sentinel.agent.diagnosis.incidents import compute_fixes, evidence_values
from vllm_sentinel.agent.diagnosis.routing import ladder_125
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import ingest_file, ingest_text
from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms

RECORDING = Path(__file__).resolve().parents[3] / "reports" / "recordings" / "cpu-tiny-llama.prom.gz"
INSTANCE = "a:8000"
T0_S = 1_796_000_000 - 1_796_000_000 % 60  # on a whole minute: 30 s bins line up with the steps
SCRAPE_S = 5
STEP_S = 120
BIN_MS = 30_000
# vLLM 0.32's bucket bounds (vllm/v1/metrics/loggers.py) for the families capacity reads
TTFT_LE = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
           80.0, 160.0, 640.0, 2560.0]
ITL_LE = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
PROMPT_LE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
# (requests/s, TTFT s, TPOT s, end-to-end s): latency turns up at 3/s and misses both objectives at 8/s
STEPS = [(1.5, 0.15, 0.02, 1.0), (3.0, 0.3, 0.02, 1.2), (5.0, 0.9, 0.04, 1.6), (8.0, 3.0, 0.17, 4.0)]
SHORT, LONG = 40, 1500  # prompt tokens of the bimodal traffic: 70% short, 30% long


def _p95_in_bucket(value: float, bounds: list[float]) -> float:
    """histogram_quantile(0.95) when every observation is `value`: interpolated inside its bucket."""
    hi = next(b for b in bounds if value <= b)
    lo = max([b for b in bounds if b < hi], default=0.0)
    return lo + (hi - lo) * 0.95


def _histogram(name: str, bounds: list[float], observations: dict[float, float], ts: float) -> list[str]:
    """One cumulative histogram's bucket, count and sum lines at `ts` (OpenMetrics, seconds)."""
    lab = f'instance="{INSTANCE}",model_name="m"'
    out = []
    for le in [*bounds, math.inf]:
        c = sum(n for v, n in observations.items() if v <= le)
        out.append(f'{name}_bucket{{{lab},le="{"+Inf" if math.isinf(le) else le}"}} {c} {ts}')
    out.append(f"{name}_count{{{lab}}} {sum(observations.values())} {ts}")
    out.append(f"{name}_sum{{{lab}}} {sum(v * n for v, n in observations.items())} {ts}")
    return out


def generated_history(bimodal: bool = True) -> str:
    """OpenMetrics text of the four load steps, every counter built scrape by scrape from the steps."""
    lab = f'instance="{INSTANCE}",model_name="m"'
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    prompt: dict[float, float] = {}
    e2e: dict[float, float] = {}
    done = tokens = 0.0
    families = ["# TYPE vllm:request_success counter", "# TYPE vllm:prompt_tokens counter",
                "# TYPE vllm:num_requests_running gauge"]
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:request_prompt_tokens", "vllm:e2e_request_latency_seconds"):
        families.append(f"# TYPE {name} histogram")
    samples: list[str] = []
    for k in range(len(STEPS) * STEP_S // SCRAPE_S + 1):
        ts = T0_S + k * SCRAPE_S
        if k:  # the scrape at ts counts the requests of (ts - 5 s, ts], at the rate of that stretch's step
            rate, t, tpot, w = STEPS[(k - 1) * SCRAPE_S // STEP_S]
            n = rate * SCRAPE_S
            done += n
            ttft[t] = ttft.get(t, 0.0) + n
            itl[tpot] = itl.get(tpot, 0.0) + 50 * n  # 50 output tokens each
            e2e[w] = e2e.get(w, 0.0) + n
            shares = {SHORT: 0.7, LONG: 0.3} if bimodal else {SHORT: 1.0}
            for length, share in shares.items():
                prompt[length] = prompt.get(length, 0.0) + share * n
                tokens += share * n * length
            running = rate * w  # what the server held: Little's law, as a real one would show
        else:
            running = 0.0
        samples += [f'vllm:request_success_total{{{lab},finished_reason="stop"}} {done} {ts}',
                    f"vllm:prompt_tokens_total{{{lab}}} {tokens} {ts}",
                    f"vllm:num_requests_running{{{lab}}} {running} {ts}"]
        samples += _histogram("vllm:time_to_first_token_seconds", TTFT_LE, ttft, ts)
        samples += _histogram("vllm:inter_token_latency_seconds", ITL_LE, itl, ts)
        samples += _histogram("vllm:request_prompt_tokens", PROMPT_LE, prompt, ts)
        samples += _histogram("vllm:e2e_request_latency_seconds", TTFT_LE, e2e, ts)
    # OpenMetrics wants each family's samples together: order by family name, then time
    samples.sort(key=lambda line: (line.split("{")[0].rsplit("_", 1)[0] if "_bucket{" in line else
                                   line.split("{")[0], float(line.rsplit(" ", 1)[1])))
    return "\n".join(families + samples + ["# EOF", ""])


def _store(tmp_path: Path, text: str) -> Store:
    store = Store.open(tmp_path / "history.duckdb")
    result = ingest_text(store, text, None, T0_S * 1000)
    assert result.skipped == 0, result.skipped_message()
    return store


def _query(**kw) -> CapacityQuery:
    end_ms = (T0_S + len(STEPS) * STEP_S) * 1000
    return CapacityQuery(**{"start_ms": T0_S * 1000, "end_ms": end_ms, "bin_ms": BIN_MS, "ttft_slo_s": 2.0,
                            "tpot_slo_s": 0.1, **kw})


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = _store(tmp_path_factory.mktemp("capacity"), generated_history())
    yield store
    store.close()


def test_levels_follow_the_load_steps(history: Store) -> None:
    doc = capacity(Engine(history), _query())
    levels = doc["levels"]
    assert [round(lv["request_rate_per_s"], 3) for lv in levels] == [r for r, *_ in STEPS]
    for lv, (_, ttft, tpot, _) in zip(levels, STEPS):
        assert lv["ttft_p95_seconds"] == pytest.approx(_p95_in_bucket(ttft, TTFT_LE))
        assert lv["tpot_p95_seconds"] == pytest.approx(_p95_in_bucket(tpot, ITL_LE))
        assert lv["judged"] and lv["bins"] == STEP_S * 1000 // BIN_MS
    cov = doc["coverage"]
    assert (cov["request_rate_min_per_s"], cov["request_rate_max_per_s"]) == pytest.approx((1.5, 8.0))
    assert "1.5 .. 8 requests/s" in cov["statement"], cov["statement"]


def test_slo_point_is_the_highest_step_meeting_both_objectives(history: Store) -> None:
    doc = capacity(Engine(history), _query())
    slo = doc["slo_point"]
    rate, ttft, tpot, w = STEPS[2]  # 8/s misses TTFT and TPOT; 5/s is the top that met them
    assert slo["request_rate_per_s"] == pytest.approx(rate)
    assert not slo["bounded_by_history"]
    assert slo["next_level"]["request_rate_per_s"] == pytest.approx(STEPS[3][0])
    assert [m.split()[0] for m in slo["next_level"]["missed"]] == ["TTFT", "TPOT"]
    ttft_p95 = _p95_in_bucket(ttft, TTFT_LE)
    assert slo["margin"]["ttft_pct"] == pytest.approx(round((2.0 - ttft_p95) / 2.0 * 100, 1))
    assert slo["littles_law_concurrency"] == pytest.approx(rate * w, rel=1e-3)  # end-to-end sum / count
    # the gauge's mean: avg_over_time's window takes the sample on its left edge too (the step before)
    assert slo["running_mean"] == pytest.approx(rate * w, rel=0.05)


def test_knee_is_the_first_step_over_twice_the_low_load_latency(history: Store) -> None:
    knee = capacity(Engine(history), _query())["knee"]
    # TTFT 0.15 s (p95 in bucket 0.1..0.25) -> 0.3 s (0.25..0.5): more than twice, at the second step
    assert knee["request_rate_per_s"] == pytest.approx(STEPS[1][0])
    assert knee["signal"] == "ttft_p95_seconds"
    assert knee["value"] > 2 * knee["baseline"]
    # a factor of 3 moves it to the step where TTFT p95 passes 3 x 0.2425 s: 0.9875 s (bucket 0.75..1.0) at 5/s
    assert capacity(Engine(history), _query(knee_factor=3.0))["knee"]["request_rate_per_s"] == pytest.approx(5.0)


def test_replicas_inside_the_range_and_extrapolated_past_it(history: Store) -> None:
    inside = capacity(Engine(history), _query(target_rps=6.0))["replicas"]
    assert inside["replicas"] == 2 and not inside["extrapolated"] and inside["warning"] is None  # ceil(6 / 5)
    past = capacity(Engine(history), _query(target_rps=20.0))["replicas"]
    assert past["replicas"] == 4 and past["extrapolated"]  # ceil(20 / 5), but 20/s was never observed
    assert "extrapolated" in past["warning"] and "8/s" in past["warning"], past


def test_no_level_missing_makes_the_top_a_lower_bound(history: Store) -> None:
    doc = capacity(Engine(history), _query(ttft_slo_s=10.0, tpot_slo_s=1.0, target_rps=20.0))
    slo = doc["slo_point"]
    assert slo["request_rate_per_s"] == pytest.approx(8.0) and slo["bounded_by_history"]
    assert "upper bound" in doc["replicas"]["warning"]
    assert any("nothing above that was observed" in w for w in doc["warnings"])


def test_no_slo_point_when_the_lowest_level_already_misses(history: Store) -> None:
    doc = capacity(Engine(history), _query(ttft_slo_s=0.1))
    assert doc["slo_point"] is None
    assert doc["replicas"] is None


def test_routing_cut_sits_between_the_prompt_modes(history: Store) -> None:
    route = capacity(Engine(history), _query())["routing"]
    # 40-token prompts fill bucket 20..50, 1500-token ones 1000..2000: the empty buckets 50..1000 are the
    # valley, whose log-middle (224) is nearest the bucket bound 200
    assert route["cut_tokens"] == 200 and route["cut_tokens"] in ladder_125(50, 1000)
    assert route["short"]["share_of_requests"] == pytest.approx(0.7)
    assert route["short"]["max_num_batched_tokens"] >= route["cut_tokens"]
    assert route["long"]["max_num_batched_tokens"] >= LONG  # a long prompt prefills in one step there
    assert route["long"]["long_prefill_token_threshold"] < route["long"]["max_num_batched_tokens"]


def test_no_routing_section_for_one_prompt_mode(tmp_path: Path) -> None:
    with _store(tmp_path, generated_history(bimodal=False)) as store:
        assert capacity(Engine(store), _query())["routing"] is None


def test_a_window_without_requests_says_what_the_store_holds(history: Store) -> None:
    with pytest.raises(NoLoadInWindow, match="no completed requests"):
        capacity(Engine(history), _query(start_ms=0, end_ms=600_000))


def test_the_daemon_route_answers_the_same_document(history: Store) -> None:
    query = _query(target_rps=20.0, instance=INSTANCE)
    wire = {k: str(v) for k, v in query.as_params().items()}  # query strings, as the socket carries them
    answer = daemon_route_capacity()(history, wire)
    direct = capacity(Engine(history), clamp_to_data(query, history.time_range()), source=f"duckdb:{history.path}")
    assert answer == direct


def test_recorded_session_bins_agree_with_promql(tmp_path: Path) -> None:
    """On the real recording: each bin's TTFT p95 is PromQL's histogram_quantile over the same 30 s."""
    with Store.open(tmp_path / "rec.duckdb") as store:
        ingest_file(store, RECORDING)
        first, last = store.time_range()
        engine = Engine(store)
        doc = capacity(engine, CapacityQuery(first, last, BIN_MS, 2.0, 0.1))
        expr = ("histogram_quantile(0.95, sum by (instance, le) "
                "(increase(vllm:time_to_first_token_seconds_bucket[30s])))")
        checked = 0
        for b in doc["bins"]:
            if b["ttft_p95_seconds"] is None:
                continue
            [sample] = engine.instant(expr, parse_rfc3339_ms(b["end"]))
            assert b["ttft_p95_seconds"] == pytest.approx(sample.value, rel=1e-6), b["end"]
            checked += 1
        assert checked >= 8
        cov = doc["coverage"]
        rates = [b["request_rate_per_s"] for b in doc["bins"]]
        assert (cov["request_rate_min_per_s"], cov["request_rate_max_per_s"]) == (min(rates), max(rates))
        # the scenarios sent 12-, 16- and 32-token prompts and 200-token ones (agent/demo/scenarios.py):
        # the cut separates them
        assert 32 <= doc["routing"]["cut_tokens"] < 200, doc["routing"]


def test_the_incident_fix_reads_the_same_cut_from_the_rules_evidence(history: Store) -> None:
    """prefill_hol_blocking's routing fix, from its rule's evidence queries over the same history."""
    rule = next(r for f in load_pack() for g in f.groups for r in g.rules if r.name == "VllmPrefillHolBlocking")
    labels = {"instance": INSTANCE, "model_name": "m"}
    evidence = evidence_values(rule, Engine(history).instant, _query().end_ms, labels)
    values = {e["signal"]: e["value"] for e in evidence}
    assert values["prompt_spread_ratio"] == 4 and values["prompt_tokens_p50"] < 50 < 1000 < values["prompt_tokens_p95"]
    fixes = compute_fixes(rule, {"max_num_batched_tokens": 2048, "block_size": 16, "max_num_seqs": 256}, values,
                          labels)
    [routing] = [f for f in fixes if f["param"] == "routing"]
    cut = capacity(Engine(history), _query())["routing"]["cut_tokens"]
    assert routing["suggested"].startswith(f"prompts <= {cut} tokens -> short pool"), routing
    assert "--max-num-batched-tokens 2048" in routing["suggested"]  # the long pool keeps at least the current budget
    assert "of requests" in routing["why"] and "p25..p99" in routing["why"]
