"""`compare` on the recorded real session (reports/recordings/cpu-tiny-llama.prom.gz) in a real DuckDB file.

The session ran its scenarios one after another on one server: queue_blocking (no preemption),
then kv_cache_pressure (3 preemptions/s). Their windows are two real stretches of history with
different preemption rates; two halves of the steady queue_blocking load are pure noise. The
session has no restart, so the configuration change the sidecar would record is added as a
snapshot (the recorded one with `--max-num-seqs` changed) at the start of kv_cache_pressure.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.agent.diagnosis.test_change_points import INSTANCE as DUMPED
from tests.agent.diagnosis.test_change_points import SCRAPE_MS, T0, Dump, Phase, dump, loaded, user_case
from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.diagnosis import liveconfig
from vllm_sentinel.agent.diagnosis.compare import CompareError, CompareRequest, NoChangeFound, compare, decide
from vllm_sentinel.agent.diagnosis.compare_slo import bound_under, share_under
from vllm_sentinel.agent.diagnosis.compare_sources import request_from_query, request_query, store_source
from vllm_sentinel.agent.diagnosis.window import pack_window_evaluator
from vllm_sentinel.agent.promql.notation import parse_series_selector
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import ingest_text
from vllm_sentinel.collectors.base import Batch
from vllm_sentinel.collectors.timefmt import iso_seconds, parse_rfc3339_ms
from vllm_sentinel.reports.compare_view import config_lines

CANARY = "canary:8000"


@pytest.fixture(scope="module")
def session(recorded_db: tuple) -> dict:
    """The recorded session in a DuckDB file, its phases, and its instance."""
    meta = load_metadata(default_recording())
    path, first, last = recorded_db
    instance = meta["config_snapshots"][0]["instance"]
    phases = {s["name"]: (s["start_ms"], s["end_ms"]) for s in meta["scenarios"]}
    return {"path": path, "phases": phases, "instance": instance, "span": (first - 1, last)}


@pytest.fixture(scope="module")
def changed(session: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The session with a second snapshot at kv_cache_pressure's start: --max-num-seqs 4 -> 6."""
    path = tmp_path_factory.mktemp("compare-change") / "changed.duckdb"
    path.write_bytes(Path(session["path"]).read_bytes())
    at = session["phases"]["kv_cache_pressure"][0]
    with Store.open(path) as store:
        cfg = liveconfig.load_snapshot_at(store, session["instance"], at)
        assert cfg is not None and cfg.values["max_num_seqs"] == 4
        cfg.values["max_num_seqs"] = 6
        assert liveconfig.save_snapshot(store, cfg, at)
    return {**session, "path": path, "change_ms": at}


@pytest.fixture(scope="module")
def canary(session: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The session beside a copy of itself under another instance name (a canary serving the same traffic)."""
    path = tmp_path_factory.mktemp("compare-canary") / "canary.duckdb"
    path.write_bytes(Path(session["path"]).read_bytes())
    text = gzip.open(default_recording(), "rt").read().replace(f'instance="{session["instance"]}"',
                                                               f'instance="{CANARY}"')
    with Store.open(path) as store:
        ingest_text(store, text, None, session["span"][1])
    return {**session, "path": path}


def thinned(session: dict, path: Path, every: int = 4, failed_scrapes: bool = False) -> dict:
    """The session with every `every`th sample of each series kept (scrapes 2 s x `every` apart); with
    `failed_scrapes`, a staleness marker halfway between two kept ones, as a scrape that timed out
    writes for each series of its target."""
    seen: dict[str, int] = {}
    kept = []
    stale: dict[str, Batch] = {}
    for line in gzip.open(default_recording(), "rt").read().splitlines():
        if line.startswith("#"):
            continue
        key, _value, ts = line.rsplit(" ", 2)
        seen[key] = seen.get(key, -1) + 1
        if seen[key] % every == 0:
            kept.append(line)
        elif seen[key] % every == every // 2 and failed_scrapes:
            name, labels = parse_series_selector(key)
            instance = labels.pop("instance")
            stale.setdefault(instance, Batch(instance=instance, ts_ms=0)).add(name, labels, None, int(ts))
    with Store.open(path) as store:
        ingest_text(store, "\n".join(kept) + "\n", None, session["span"][1])
        store.append_many(list(stale.values()))
    return {**session, "path": path}


@pytest.fixture(scope="module")
def sparse(session: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Scrapes 8 s apart, as a starved sidecar (its interval stretched) or a Prometheus at 15 s has them."""
    return thinned(session, tmp_path_factory.mktemp("compare-sparse") / "sparse.duckdb")


@pytest.fixture(scope="module")
def sparser(session: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Scrapes 16 s apart, as a server too busy to answer most scrapes in time: some 10 s intervals hold none."""
    return thinned(session, tmp_path_factory.mktemp("compare-sparser") / "sparser.duckdb", every=8)


@pytest.fixture(scope="module")
def failing(session: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Scrapes 8 s apart and a failed one between each two: every series stale for 4 s of each 8."""
    return thinned(session, tmp_path_factory.mktemp("compare-failing") / "failing.duckdb", failed_scrapes=True)


def run(path: Path, req: CompareRequest) -> dict:
    with Store.open(path, read_only=True) as store:
        doc = compare(store_source(store, pack_window_evaluator(load_pack())), req)
    json.dumps(doc)  # the document is JSON as it stands
    return doc


def signals(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["signals"]}


def test_a_real_difference_is_significant_with_the_contract_fields(session: dict) -> None:
    p = session["phases"]
    doc = run(session["path"], CompareRequest(session["span"], before=p["queue_blocking"], after=p["kv_cache_pressure"]))
    assert doc["instances"] == [session["instance"]]
    assert set(doc["window"]["before"]) == {"start", "end"} and set(doc["window"]["after"]) == {"start", "end"}
    pre = signals(doc)["preemptions_per_s"]
    assert set(pre) >= {"name", "before", "after", "delta_pct", "significant", "better", "method"}
    assert pre["before"] == 0 and pre["after"] > 1, pre
    assert pre["significant"] is True and pre["better"] is False, pre
    assert "Mann-Whitney" in pre["method"]
    # 1 200 short requests before, 370 long ones after: counts are weighed per finished request
    assert doc["load"]["per_request"] is True and "per finished request" in pre["method"]
    assert doc["incidents"]["started"] == ["kv_cache_pressure"], doc["incidents"]
    # goodput fell (TTFT past the 2 s objective for nearly every request): regressed, goodput first
    assert doc["verdict"] == "regressed", doc["verdict_reasons"]
    assert doc["verdict_reasons"][0].startswith("goodput_rps "), doc["verdict_reasons"]
    assert signals(doc)["goodput_rps"]["significant"] is True and signals(doc)["goodput_rps"]["better"] is False
    assert "preemptions_per_s 0 -> 3.333 (worse)" in doc["verdict_reasons"] or any(
        r.startswith("preemptions_per_s") and r.endswith("(worse)") for r in doc["verdict_reasons"])
    assert doc["config_changes"] == []  # one configuration throughout


def test_noise_is_not_significant(session: dict) -> None:
    start, end = session["phases"]["queue_blocking"]
    mid = (start + end) // 2
    doc = run(session["path"], CompareRequest(session["span"], before=(start, mid), after=(mid, end)))
    tested = [s for s in doc["signals"] if s["method"].startswith("Mann-Whitney")]
    assert len(tested) >= 10, [s["method"] for s in doc["signals"]]
    assert [s["name"] for s in doc["signals"] if s["significant"]] == []
    # the halves differ by a few per cent: a difference, but not one beyond the noise
    assert any(s["delta_pct"] not in (None, 0) for s in tested)


def test_change_auto_finds_the_snapshot_and_sets_equal_windows(changed: dict) -> None:
    stretch = (changed["phases"]["queue_blocking"][0], changed["phases"]["kv_cache_pressure"][1])
    doc = run(changed["path"], CompareRequest(stretch, settle_ms=10_000))
    at = changed["change_ms"]
    assert doc["config_changes"] == [{"param": "--max-num-seqs", "before": "4", "after": "6",
                                      "at": doc["window"]["change"]["at"]}]
    assert doc["window"]["change"]["kind"] == "configuration change"
    w = {k: (parse_rfc3339_ms(v["start"]), parse_rfc3339_ms(v["end"])) for k, v in doc["window"].items()
         if k in ("before", "after")}
    assert w["before"][1] == at // 1000 * 1000 and w["after"][0] == (at + 10_000) // 1000 * 1000
    assert w["before"][1] - w["before"][0] == w["after"][1] - w["after"][0]
    assert signals(doc)["preemptions_per_s"]["significant"] is True
    assert "kv_cache_pressure" in doc["incidents"]["started"]


def test_no_change_and_too_little_after_it_say_so(session: dict, changed: dict) -> None:
    p = session["phases"]
    with pytest.raises(NoChangeFound, match="no configuration change or restart"):
        run(session["path"], CompareRequest((p["healthy"][0], p["kv_cache_pressure"][1])))
    with pytest.raises(NoChangeFound, match="either side"):  # the default 60 s margin leaves too little
        run(changed["path"], CompareRequest((p["queue_blocking"][0], changed["change_ms"] + 70_000)))


def test_versus_compares_two_instances_over_one_window(canary: dict) -> None:
    window = canary["phases"]["kv_cache_pressure"]
    doc = run(canary["path"], CompareRequest(canary["span"], instance=canary["instance"], versus=CANARY,
                                             before=window))
    assert doc["instances"] == [canary["instance"], CANARY]
    assert doc["window"]["before"] == doc["window"]["after"]
    # the same samples under two names: equal values, nothing significant, no verdict either way
    assert all(s["before"] == s["after"] and not s["significant"] for s in doc["signals"])
    assert doc["verdict"] == "no clear change"


def test_several_instances_need_one_named(canary: dict) -> None:
    with pytest.raises(CompareError, match="--instance"):
        run(canary["path"], CompareRequest(canary["span"], before=canary["phases"]["healthy"],
                                           after=canary["phases"]["queue_blocking"]))


def test_the_daemon_query_round_trips() -> None:
    req = CompareRequest((1, 2), "a:1", None, (3, 4), (5, 6), 10_000, None, 60_000)
    assert request_from_query({k: str(v) for k, v in request_query(req).items()}) == req
    slo = CompareRequest((1, 2), ttft_slo_s=1.5, tpot_slo_s=0.08, slo_source="TTFT from --ttft-p95")
    assert request_from_query({k: str(v) for k, v in request_query(slo).items()}) == slo


@pytest.mark.parametrize("thin", ["sparse", "failing", "sparser"])
def test_sparse_scrapes_lose_no_interval(session: dict, thin: str, request: pytest.FixtureRequest) -> None:
    """With scrapes 8 s apart every 10 s interval still has its count (the counters' values at the
    boundaries, one minus the other), the counts add up to the window's, and the difference holds;
    a boundary that falls after a failed scrape's staleness markers reads the last sample before them.
    Preemptions per finished request keep every interval, those where no scrape (so no request) landed too."""
    p = session["phases"]
    req = CompareRequest(session["span"], before=p["queue_blocking"], after=p["kv_cache_pressure"], interval_ms=10_000)
    doc, full = run(request.getfixturevalue(thin)["path"], req), run(session["path"], req)
    for side in ("before", "after"):
        lo, hi = p["queue_blocking" if side == "before" else "kv_cache_pressure"]
        expected = (hi - lo) // 10_000
        for name in ("request_rate_per_s", "preemptions_per_s"):
            points = doc["intervals"][name][side]
            assert len([v for _t, v in points if v is not None]) == expected, (name, side, points)
            # the same requests as at full resolution, within the scrapes a boundary falls between
            assert sum(v for _t, v in points) * 10 == pytest.approx(
                sum(v for _t, v in full["intervals"][name][side] if v is not None) * 10, rel=0.1, abs=8)
    pre = signals(doc)["preemptions_per_s"]
    assert pre["significant"] is True and pre["better"] is False, pre
    assert doc["load"]["per_request"] is True
    n = [(hi - lo) // 10_000 for lo, hi in (p["queue_blocking"], p["kv_cache_pressure"])]
    assert f"Mann-Whitney U over 10 s intervals ({n[0]} vs {n[1]})" in pre["method"], pre["method"]


def test_an_incident_carried_over_from_before_the_change_is_not_the_after_sides() -> None:
    """One that began before the after window and resolved inside it stopped; one still firing at its end,
    or begun inside it, is the after side's."""
    from vllm_sentinel.agent.diagnosis.compare import incident_changes
    after_window = (parse_rfc3339_ms("2026-12-02T10:02:00Z"), parse_rfc3339_ms("2026-12-02T10:04:00Z"))
    before = [{"incident": "kv_cache_pressure", "start": "2026-12-02T10:00:00Z", "end": None},
              {"incident": "queue_blocking", "start": "2026-12-02T10:00:30Z", "end": None}]
    after = [{"incident": "kv_cache_pressure", "start": "2026-12-02T10:01:55Z", "end": "2026-12-02T10:02:40Z"},
             {"incident": "queue_blocking", "start": "2026-12-02T10:01:55Z", "end": None},
             {"incident": "target_down", "start": "2026-12-02T10:03:00Z", "end": "2026-12-02T10:03:30Z"}]
    doc = incident_changes(before, after, after_window)
    assert doc == {"stopped": ["kv_cache_pressure"], "started": ["target_down"],
                   "before": ["kv_cache_pressure", "queue_blocking"], "after": ["queue_blocking", "target_down"],
                   "carried_over": ["kv_cache_pressure"]}


def test_a_restart_fixing_preemption_stops_the_incident_that_the_rule_window_carries_past_it(tmp_path: Path) -> None:
    """Preemption, the server down 80 s for a restart, then none, in a store no daemon watched (replayed
    incidents only): kv_cache_pressure stopped. Its rule's 2 m window still holds the samples from before
    the restart for 40 s of the after window; that incident is the before side's, carried over."""
    t0, down, up_again, end = 1_795_000_020_000, 1_795_000_120_000, 1_795_000_200_000, 1_795_000_320_000
    with Store.open(tmp_path / "restart.duckdb") as store:
        for t in range(t0, end, 1000):
            b = Batch(instance="10.0.0.1:8000", ts_ms=t)
            labels = {"model_name": "m", "engine": "0"}
            if down <= t < up_again:
                if t == down:  # the failed scrape's staleness markers
                    for name in ("vllm:num_preemptions_total", "vllm:kv_cache_usage_perc",
                                 "vllm:request_success_total"):
                        b.add(name, labels, None)
                    store.append(b)
                continue
            before = t < down
            b.add("vllm:num_preemptions_total", labels, 5.0 * (t - t0) / 1000 if before else 0.0)
            b.add("vllm:kv_cache_usage_perc", labels, 0.99 if before else 0.6)
            b.add("vllm:request_success_total", labels, (t - (t0 if before else up_again)) / 1000)
            store.append(b)
        windows = {"before": (t0 + 1000, down), "after": (up_again + 10_000, end)}
        doc = compare(store_source(store, pack_window_evaluator(load_pack())),
                      CompareRequest(stretch=(t0, end), **windows))
    assert doc["incidents"]["before"] == ["kv_cache_pressure"], doc["incidents"]
    assert doc["incidents"]["stopped"] == ["kv_cache_pressure"], doc["incidents"]
    assert "kv_cache_pressure" not in doc["incidents"]["after"], doc["incidents"]


TTFT_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)
TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2)
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"


@dataclass
class Load:
    """One side of a synthetic server: requests finished per second, where their latencies fell, preemptions."""

    rate: float
    ttft: dict[float, float]  # bucket bound -> share of requests in (the bound below, this bound]
    tpot: dict[float, float] = field(default_factory=lambda: {0.05: 1.0})
    preemptions: float = 0.0
    tpot_histogram: str = TPOT


def served(path: Path, before: Load, after: Load, seconds: int = 300) -> tuple[tuple[int, int], tuple[int, int]]:
    """A store with `before` then `after` served, scraped every second, each request count jittered
    +-20 % per second (seeded); returns the two windows."""
    rng = random.Random(7)
    t0 = 1_795_000_000_000
    labels = {"model_name": "m", "engine": "0"}
    totals: dict[tuple[str, str], float] = {}

    def count(name: str, le: str | None, add: float) -> tuple[str, dict[str, str], float]:
        key = (name, le or "")
        totals[key] = totals.get(key, 0.0) + add
        return name, {**labels, "le": le} if le else labels, totals[key]

    def histogram(name: str, bounds: tuple[float, ...], shares: dict[float, float], n: float) -> list:
        cumulative = [sum(v for b, v in shares.items() if b <= bound) for bound in bounds]
        return [count(f"{name}_bucket", str(bound), n * c) for bound, c in zip(bounds, cumulative)] + \
            [count(f"{name}_bucket", "+Inf", n)]

    batches = []
    for t in range(t0 - 10_000, t0 + 2 * seconds * 1000 + 1, 1000):
        side = before if t <= t0 + seconds * 1000 else after
        n = side.rate * rng.uniform(0.8, 1.2)
        b = Batch(instance="10.0.0.1:8000", ts_ms=t)
        samples = [count("vllm:request_success_total", None, n), count("vllm:generation_tokens_total", None, 100 * n),
                   count("vllm:num_preemptions_total", None, side.preemptions * rng.uniform(0.8, 1.2))]
        samples += histogram("vllm:time_to_first_token_seconds", TTFT_BOUNDS, side.ttft, n)
        samples += histogram(side.tpot_histogram, TPOT_BOUNDS, side.tpot, n)
        for name, lab, v in samples:
            b.add(name, lab, v)
        batches.append(b)
    with Store.open(path) as store:
        store.append_many(batches)
    return (t0, t0 + seconds * 1000), (t0 + seconds * 1000, t0 + 2 * seconds * 1000)


def compared(path: Path, before: Load, after: Load, **slo: float) -> dict:
    b, a = served(path, before, after)
    return run(path, CompareRequest((b[0] - 10_000, a[1]), before=b, after=a, **slo))


def test_fewer_preemptions_bought_with_twice_the_ttft_and_less_throughput_is_a_trade_off(tmp_path: Path) -> None:
    """Nobody meets the 2 s TTFT objective on either side (goodput 0 both): the headline signals decide,
    and a change that stopped preempting but doubled TTFT and served less is a trade-off, said as one."""
    doc = compared(tmp_path / "trade.duckdb", Load(2.0, {5.0: 1.0}, preemptions=1.0),
                   Load(1.6, {10.0: 1.0}))
    sig = signals(doc)
    assert doc["slo"]["goodput_rps"] == {"before": 0.0, "after": 0.0}, doc["slo"]
    assert doc["verdict"] == "trade-off", doc["verdict_reasons"]
    assert doc["verdict_reasons"][0].startswith("goodput_rps 0 on both sides"), doc["verdict_reasons"]
    bought = next(r for r in doc["verdict_reasons"] if " bought with " in r)
    assert bought.startswith("preemptions_per_s -100% bought with ttft_p95_seconds +100%"), bought
    assert ", request_rate_per_s -" in bought and ", generation_tokens_per_s -" in bought, bought
    assert sig["ttft_p95_seconds"]["significant"] and sig["ttft_p95_seconds"]["better"] is False
    # each significant headline signal keeps its own reason in the one form the demo's check reads
    assert "preemptions_per_s -100% (better)" in doc["verdict_reasons"], doc["verdict_reasons"]
    # the preemption incident stopped, and is listed, but turns nothing
    assert "incident kv_cache_pressure stopped" in doc["verdict_reasons"], doc["incidents"]
    assert any(r.startswith("ttft_p95_seconds") and r.endswith("(worse)") for r in doc["verdict_reasons"])


def test_more_requests_under_the_ttft_objective_is_improved_at_the_named_cost(tmp_path: Path) -> None:
    """Half the requests under 2 s before, 90 % after, the slowest tenth slower: goodput rose, so improved,
    and the worse TTFT p95 is named as its cost."""
    doc = compared(tmp_path / "better.duckdb", Load(2.0, {0.5: 0.5, 5.0: 0.5}), Load(2.0, {0.5: 0.9, 10.0: 0.1}))
    sig = signals(doc)
    assert sig["goodput_rps"]["significant"] and sig["goodput_rps"]["better"], sig["goodput_rps"]
    assert sig["ttft_p95_seconds"]["significant"] and sig["ttft_p95_seconds"]["better"] is False
    assert doc["verdict"] == "improved", doc["verdict_reasons"]
    assert doc["slo"]["attainment"] == {"before": pytest.approx(0.5), "after": pytest.approx(0.9)}, doc["slo"]
    lead = doc["verdict_reasons"][0]
    # about 1 -> 1.8 requests/s under the objectives (the request count is jittered)
    assert re.fullmatch(r"goodput_rps 0\.9\d* -> 1\.[78]\d* /s \(\+8\d%\), SLO attainment 50% -> 90%, "
                        r"at the cost of ttft_p95_seconds \+58%", lead), lead


def test_goodput_falling_is_regressed_whatever_p95_improved(tmp_path: Path) -> None:
    doc = compared(tmp_path / "worse.duckdb", Load(2.0, {0.5: 0.9, 10.0: 0.1}), Load(2.0, {0.5: 0.5, 5.0: 0.5}))
    assert doc["verdict"] == "regressed", doc["verdict_reasons"]
    lead = doc["verdict_reasons"][0]
    assert re.fullmatch(r"goodput_rps 1\.[78]\d* -> 0\.9\d* /s \(-4\d%\), SLO attainment 90% -> 50%, "
                        r"despite ttft_p95_seconds -37%", lead), lead


def test_the_slo_block_reads_an_objective_between_bounds_at_the_bound_under_it(tmp_path: Path) -> None:
    """TTFT 2 s lies between le=1.0 and le=2.5: read at 1.0, and said so; TPOT 80 ms, from the inter-token
    latency histogram where there is no per-request one, at 0.075. Requests between count as missed."""
    fast = {0.5: 0.4, 2.5: 0.6}  # 60 % between 1 s and 2.5 s: under 2 s or not, the buckets cannot tell
    doc = compared(tmp_path / "bounds.duckdb", Load(2.0, fast, tpot={0.075: 0.8, 0.1: 0.2}, tpot_histogram=ITL),
                   Load(2.0, fast, tpot={0.075: 0.8, 0.1: 0.2}, tpot_histogram=ITL), ttft_slo_s=2.0, tpot_slo_s=0.08)
    slo = doc["slo"]
    assert set(slo) == {"ttft_p95_s", "tpot_p95_s", "attainment", "goodput_rps", "method"}
    assert (slo["ttft_p95_s"], slo["tpot_p95_s"]) == (2.0, 0.08)
    assert set(slo["attainment"]) == set(slo["goodput_rps"]) == {"before", "after"}
    assert slo["attainment"]["before"] == pytest.approx(0.4) and slo["attainment"]["after"] == pytest.approx(0.4)
    assert slo["goodput_rps"]["before"] == pytest.approx(0.8, rel=0.05), slo
    assert "TTFT read at le=1.0, the bound under 2 s" in slo["method"], slo["method"]
    assert "read at le=0.075, the bound under 80 ms" in slo["method"] and ITL in slo["method"], slo["method"]
    assert "upper bound" in slo["method"] and "defaults" in slo["method"]
    assert doc["verdict"] == "no clear change", doc["verdict_reasons"]
    assert "not changed beyond the noise" in doc["verdict_reasons"][0], doc["verdict_reasons"]


def test_shares_read_at_the_bound_equal_to_or_under_the_objective() -> None:
    buckets = {0.5: 3.0, 1.0: 6.0, 2.5: 9.0, math.inf: 10.0}
    assert share_under(buckets, 2.5) == pytest.approx(0.9)  # a bound: read there
    assert share_under(buckets, 2.0) == pytest.approx(0.6)  # between: the bound under it
    assert share_under(buckets, 0.1) == 0.0  # under every bound: nothing counts as met
    assert share_under({0.5: 0.0, math.inf: 0.0}, 1.0) is None  # no observation: no share
    assert bound_under((0.05, 0.1, 0.2), 0.1) == 0.1 and bound_under((0.05, 0.1), 0.3 / 3) == 0.1


def _row(name: str, delta: float, better: bool, significant: bool = True, headline: bool = True) -> dict:
    return {"name": name, "before": 1.0, "after": 1.0 + delta / 100, "delta_pct": delta, "significant": significant,
            "better": better, "_headline": headline}


def test_incidents_never_turn_the_verdict() -> None:
    """An incident that stopped while goodput fell is no improvement; one that started with nothing beyond
    the noise is no regression. Both are listed."""
    fell = [_row("goodput_rps", -40, False, headline=False), _row("slo_attainment", -40, False, headline=False)]
    verdict, reasons = decide(fell, {"stopped": ["kv_cache_pressure"], "started": []})
    assert verdict == "regressed" and "incident kv_cache_pressure stopped" in reasons, reasons
    flat = [_row("goodput_rps", 1, True, significant=False, headline=False)]
    verdict, reasons = decide(flat, {"stopped": [], "started": ["ttft_slo_breach"]})
    assert verdict == "no clear change" and "incident ttft_slo_breach started" in reasons, reasons
    # no histogram to read goodput from: the headline signals decide
    verdict, reasons = decide([_row("preemptions_per_s", -100, True)], {"stopped": [], "started": []})
    assert verdict == "improved" and reasons[0].startswith("goodput unknown"), reasons


# -- changes found in the metrics alone: an ingested dump (tests/agent/diagnosis/test_change_points.py) ----------

def dumped(d: Dump) -> dict:
    """`compare --change auto` over the dump loaded by `ingest` into an in-memory store (its end as --until)."""
    store = loaded(d)
    try:
        doc = compare(store_source(store, pack_window_evaluator(load_pack())), CompareRequest(d.stretch))
    finally:
        store.close()
    json.dumps(doc)
    return doc


def _window_ms(doc: dict, side: str) -> tuple[int, int]:
    return parse_rfc3339_ms(doc["window"][side]["start"]), parse_rfc3339_ms(doc["window"][side]["end"])


def test_change_auto_over_an_ingested_dump_finds_the_relabelled_cache_config_across_the_restart() -> None:
    """The user's dump: cache_config_info 0.9/9000 -> 0.95/12000 after a minute without samples, counters from 0.
    The change is where the samples resume, its label differences are listed, and the windows lie either side
    of the gap (the after one past the settling margin), equally long; the faster TTFT after it is the verdict."""
    d = user_case()
    doc = dumped(d)
    (_first, stopped), (resumed, last) = d.spans
    change = doc["window"]["change"]
    assert change["kind"] == "configuration change", doc["window"]
    assert abs(parse_rfc3339_ms(change["at"]) - resumed) < SCRAPE_MS, (change, resumed)
    assert doc["config_changes"] == [
        {"param": "--gpu-memory-utilization", "before": "0.9", "after": "0.95", "at": change["at"]},
        {"param": "num_gpu_blocks", "before": "9000", "after": "12000", "at": change["at"]}]
    assert doc["window"]["down"] == {"start": iso_seconds(stopped), "end": iso_seconds(resumed)}, doc["window"]
    before, after = _window_ms(doc, "before"), _window_ms(doc, "after")
    assert before[1] == stopped // 1000 * 1000 and after[0] == (resumed + 60_000) // 1000 * 1000, doc["window"]
    # equally long, to the second the times are written in
    assert abs((before[1] - before[0]) - (after[1] - after[0])) <= 1000 and before[1] - before[0] >= 200_000
    assert after[1] <= last
    attainment = signals(doc)["slo_attainment"]
    assert attainment["before"] == pytest.approx(0.6) and attainment["after"] == pytest.approx(0.9), attainment
    assert doc["verdict"] == "improved", doc["verdict_reasons"]


def test_given_windows_over_a_dump_record_the_configuration_of_each_side() -> None:
    """--before/--after over the dump: each side's configuration is its cache_config_info labels, so the
    difference is recorded (no change time: the windows were given), in the document and in the table."""
    d = user_case()
    (first, stopped), (resumed, last) = d.spans
    with loaded(d) as store:
        doc = compare(store_source(store, pack_window_evaluator(load_pack())),
                      CompareRequest(d.stretch, before=(first, stopped), after=(resumed + 60_000, last)))
    assert "change" not in doc["window"]
    assert [(c["param"], c["before"], c["after"], c["at"]) for c in doc["config_changes"]] == [
        ("--gpu-memory-utilization", "0.9", "0.95", None), ("num_gpu_blocks", "9000", "12000", None)]
    assert config_lines(doc) == ["--gpu-memory-utilization 0.9 -> 0.95", "num_gpu_blocks 9000 -> 12000"]


def test_change_auto_over_a_dump_finds_a_restart_from_the_start_time_jump_alone() -> None:
    """A restart between two scrapes, no sample missing, nothing relabelled: the process start time jumped
    (and the counters reset); the windows meet at it."""
    d = dump(Phase(300, start_time_s=T0 // 1000 - 3600), Phase(300, restarted=True, start_time_s=T0 // 1000 + 299))
    doc = dumped(d)
    change = doc["window"]["change"]
    assert change["kind"] == "restart" and "down" not in doc["window"], doc["window"]
    assert abs(parse_rfc3339_ms(change["at"]) - d.spans[1][0]) < SCRAPE_MS
    assert doc["config_changes"] == []
    assert _window_ms(doc, "before")[1] == parse_rfc3339_ms(change["at"])


def test_change_auto_over_a_dump_finds_counters_that_reset() -> None:
    d = dump(Phase(300), Phase(300, restarted=True))
    doc = dumped(d)
    assert doc["window"]["change"]["kind"] == "restart" and doc["config_changes"] == []
    assert abs(parse_rfc3339_ms(doc["window"]["change"]["at"]) - d.spans[1][0]) < SCRAPE_MS


def test_a_dump_without_a_change_says_so_in_one_line() -> None:
    """Ten steady minutes, and a minute without samples in them that no reset followed (a scrape outage)."""
    for d in (dump(Phase(600)), dump(Phase(300), Phase(240, gap_before_s=60))):
        with pytest.raises(NoChangeFound) as e:
            dumped(d)
        assert str(e.value).startswith(f"no configuration change or restart of {DUMPED} between ")
        assert "\n" not in str(e.value)


def test_snapshots_stay_first_and_a_restart_only_the_metrics_show_is_found() -> None:
    """An instance the sidecar watched: its snapshot (one, never changed) is the configuration, whatever the
    info series say; the restart behind the gap is still found, and the windows skip the gap."""
    d = user_case()
    (first, stopped), (resumed, _last) = d.spans
    with loaded(d) as store:
        liveconfig.record_snapshot(store, DUMPED, first)
        doc = compare(store_source(store, pack_window_evaluator(load_pack())), CompareRequest(d.stretch))
    assert doc["window"]["change"]["kind"] == "restart", doc["window"]
    assert abs(parse_rfc3339_ms(doc["window"]["change"]["at"]) - resumed) < SCRAPE_MS
    assert doc["window"]["down"] == {"start": iso_seconds(stopped), "end": iso_seconds(resumed)}
    assert doc["config_changes"] == []


def test_cli_compare_over_an_ingested_dump(tmp_path: Path) -> None:
    """What the user ran: `ingest FILE`, then `compare --change auto` over the file's stretch."""
    d = user_case()
    (tmp_path / "dump.prom").write_text(d.text)
    db = str(tmp_path / "dump.duckdb")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "vllm_sentinel", *args], capture_output=True, text=True,
                              timeout=300)

    assert cli("ingest", str(tmp_path / "dump.prom"), "--db", db).returncode == 0
    lo, hi = d.stretch
    done = cli("compare", "--change", "auto", "--db", db, "--since", f"{(hi - lo) / 1000:.3f}s",
               "--until", f"{hi / 1000:.3f}")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "configuration change at " in text, done.stdout
    assert "configuration: --gpu-memory-utilization 0.9 -> 0.95 (at " in text, done.stdout
    assert "; num_gpu_blocks 9000 -> 12000 (at " in text and "verdict: improved" in text, done.stdout
