"""`whatif` on the recorded real session (reports/recordings/cpu-tiny-llama.prom.gz) and on its parts.

The session's kv_cache_pressure scenario is 12 clients of 200+200-token requests on 8 KV blocks of
128 tokens and 4 sequence slots: a closed loop that preempts 3.6 times a second. The model reads
that workload back from the counters and histograms, fits its step time and replays the window;
its figures are judged against what the server measured.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sentinel.agent.daemon.routes import daemon_route_whatif
from vllm_sentinel.agent.demo.replay import default_recording, load_metadata
from vllm_sentinel.agent.diagnosis.sim_calibrate import (CALIBRATION_BOUND, Unrepresentable, engine_config,
                                                         fit_length, relative_error)
from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig, SimRequest
from vllm_sentinel.agent.diagnosis.sim_workload import LengthDist, NotEnoughTraffic, read_workload
from vllm_sentinel.agent.diagnosis.whatif import WhatIfQuery, store_configs, whatif
from vllm_sentinel.agent.diagnosis.whatif_knobs import BadKnob, apply_sets, parse_rate, parse_sets
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.db import Store

CONFIG = EngineConfig(max_num_seqs=4, max_num_batched_tokens=2048, num_blocks=8, block_size=128, max_model_len=512)
LIVE = {"kv_bytes_per_token": 2048, "cache_dtype": "auto", "model_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def session(recorded_db: tuple) -> dict:
    """The recorded session in a DuckDB file and its scenarios' windows (the first 20 s of each left out)."""
    meta = load_metadata(default_recording())
    path = recorded_db[0]
    phases = {s["name"]: (s["start_ms"] + 20_000, s["end_ms"]) for s in meta["scenarios"]}
    return {"path": path, "phases": phases, "instance": meta["instance"]}


def _doc(session: dict, phase: str, sets: tuple = (), window: tuple[int, int] | None = None) -> dict:
    start, end = window or session["phases"][phase]
    with Store.open(session["path"], read_only=True) as store:
        return whatif(Engine(store), store_configs(store, start, end), WhatIfQuery(start, end, None, sets))


def test_the_workload_is_read_back_from_the_counters(session: dict) -> None:
    """12 clients of 200-token prompts and outputs, all waiting for 4 slots: a closed loop of about 12."""
    start, end = session["phases"]["kv_cache_pressure"]
    with Store.open(session["path"], read_only=True) as store:
        w = read_workload(Engine(store), None, start, end)
    assert w.instance == session["instance"]
    assert w.clients is not None and 10 <= w.clients <= 14
    assert w.prompt.mean == pytest.approx(204, abs=5) and w.output.mean == pytest.approx(200, abs=1)
    assert w.measured.rate("preemptions") > 3
    assert w.measured.frontend_s() is None  # the recording keeps vLLM's own families, not the API server's http_*
    requests = w.requests(seed=1)
    assert all(r.arrival_s == 0 for r in requests) and len(requests) >= w.measured.tally.requests
    # the light healthy load arrived on its own: an open loop, arrivals per bin as completions
    start, end = session["phases"]["healthy"]
    with Store.open(session["path"], read_only=True) as store:
        light = read_workload(Engine(store), None, start, end)
    assert light.clients is None
    assert sum(light.arrivals) == pytest.approx(light.measured.tally.requests, rel=0.2)
    times = [r.arrival_s for r in light.requests(seed=1)]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= light.seconds


def test_the_replay_of_the_kv_window_is_within_the_bound_and_more_blocks_stop_the_preemptions(session: dict) -> None:
    doc = _doc(session, "kv_cache_pressure", (("num-gpu-blocks", "80"),))
    cal = doc["calibration"]
    assert doc["withheld"] is None, cal
    assert all(e is not None and e <= CALIBRATION_BOUND for e in cal["error"].values()), cal["error"]
    assert cal["measured"]["preemptions_per_s"] > 3 and cal["modelled"]["preemptions_per_s"] > 2
    current, asked = doc["scenarios"]
    assert asked["changes"] == ["--num-gpu-blocks-override 8 -> 80"]
    assert asked["config"]["num_blocks"] == 80 and current["config"]["num_blocks"] == 8
    before, after = current["predicted"], asked["predicted"]
    # 12 requests of 400 tokens need 48 blocks: with 80 nothing is preempted and more requests meet the objective
    assert after["preemptions_per_s"] == 0 < before["preemptions_per_s"]
    assert after["goodput_rps"] > before["goodput_rps"]
    assert after["generation_tokens_per_s"] > before["generation_tokens_per_s"]
    # the same seed gives the same document
    assert _doc(session, "kv_cache_pressure", (("num-gpu-blocks", "80"),)) == doc


def test_predictions_are_withheld_where_the_replay_misses_the_measurement(session: dict) -> None:
    """The queue scenario's load changed under it (its population grew from 8 to 12 and its completions fell
    fourfold): a stationary replay misses its TTFT p95, and no prediction is shown, only the reason."""
    doc = _doc(session, "queue_blocking", (("max-num-seqs", "8"),))
    assert doc["withheld"] and "ttft_p95_s off by" in doc["withheld"]
    assert all(sc["predicted"] is None for sc in doc["scenarios"])


def test_too_little_traffic_and_an_unknown_configuration_say_what_to_do(session: dict) -> None:
    start, _end = session["phases"]["healthy"]
    with pytest.raises(NotEnoughTraffic, match="widen --since"):
        _doc(session, "healthy", window=(start - 3_600_000, start - 3_000_000))
    with pytest.raises(Unrepresentable, match="lacks num_gpu_blocks"):
        engine_config({"max_num_seqs": 4, "max_num_batched_tokens": 2048, "block_size": 128, "max_model_len": 512})


def test_knobs_parse_and_apply_in_the_operators_words() -> None:
    assert parse_sets(["max-num-seqs=2", "--num-gpu-blocks 80", "VLLM_CPU_KVCACHE_SPACE=2"]) == [
        ("max-num-seqs", "2"), ("num-gpu-blocks", "80"), ("VLLM_CPU_KVCACHE_SPACE", "2")]
    cfg, said = apply_sets(CONFIG, [("kv-cache-memory-bytes", "2GiB")], LIVE)
    assert cfg.num_blocks == 2 * 1024**3 // (2048 * 128) == 8192 and said == [
        "kv-cache-memory-bytes 2GiB: 8 -> 8192 KV blocks"]
    assert apply_sets(CONFIG, [("VLLM_CPU_KVCACHE_SPACE", "1")], LIVE)[0].num_blocks == 4096
    assert apply_sets(CONFIG, [("kv-cache-dtype", "fp8")], LIVE)[0].num_blocks == 16
    assert apply_sets(CONFIG, [("block-size", "16")], LIVE)[0].num_blocks == 64  # the same memory, smaller blocks
    assert apply_sets(CONFIG, [("scheduling-policy", "priority"), ("enable-chunked-prefill", "false")],
                      LIVE)[0].policy == "priority"
    assert parse_rate("x1.5") == parse_rate("1.5x") == parse_rate("150%") == 1.5
    for bad, words in ((["gpu-count=2"], "not a knob"), (["max-num-seqs"], "NAME=VALUE")):
        with pytest.raises(BadKnob, match=words):
            parse_sets(bad)
    for knob, words in ((("max-num-seqs", "two"), "whole number"), (("max-num-seqs", "0"), "1 or more"),
                        (("scheduling-policy", "lifo"), "fcfs or priority"),
                        (("kv-cache-memory-bytes", "lots"), "not a size")):
        with pytest.raises(BadKnob, match=words):
            apply_sets(CONFIG, [knob], LIVE)
    with pytest.raises(BadKnob, match="bytes per token of the model are unknown"):
        apply_sets(CONFIG, [("kv-cache-memory-bytes", "1GiB")], {})
    with pytest.raises(BadKnob, match="a factor"):
        parse_rate("fast")


def test_length_distributions_keep_the_measured_mean_inside_vllms_buckets() -> None:
    rng = random.Random(3)
    one = LengthDist.from_buckets({100: 0, 200: 50, 500: 50, float("inf"): 50}, 180.0)
    assert one.sample(5, rng) == [180] * 5  # every request in one bucket: the benchmark's fixed length
    spread = LengthDist.from_buckets({100: 30, 500: 80, 2000: 100, float("inf"): 100}, 600.0)
    values = spread.sample(4000, rng)
    assert sum(values) / len(values) == pytest.approx(600, rel=0.03)
    assert sum(v <= 100 for v in values) / len(values) == pytest.approx(0.3, abs=0.03)
    assert max(values) <= 2000
    # 200-word prompts: 203.9 tokens on average, nearly all in (200, 500]; they sit just above 200, spread
    # (identical lengths would preempt in lockstep, far less often than the server measured)
    words = LengthDist.from_buckets({200: 3, 500: 190, float("inf"): 190}, 203.9)
    values = words.sample(2000, rng)
    assert sum(values) / len(values) == pytest.approx(203.9, abs=0.5)
    assert len(set(values)) > 5 and sum(v > 230 for v in values) / len(values) < 0.02
    assert sum(v <= 200 for v in values) / len(values) == pytest.approx(3 / 190, abs=0.01)


def test_errors_count_from_the_floor_and_lengths_are_cut_to_max_model_len() -> None:
    assert relative_error(1.3, 1.0, 0.05) == pytest.approx(0.3)
    assert relative_error(0.04, 0.0, 0.1) == 0.0  # both under the floor: no error
    assert relative_error(None, 1.0, 0.1) is None
    cut = fit_length(SimRequest(0.0, 480, 200, cached_tokens=400), 512)
    assert (cut.prompt_tokens, cut.output_tokens, cut.cached_tokens) == (312, 200, 311)


def test_the_cli_and_the_daemon_route_answer_alike(session: dict, tmp_path: Path) -> None:
    start, end = session["phases"]["kv_cache_pressure"]
    argv = [sys.executable, "-m", "vllm_sentinel", "whatif", "--db", str(session["path"]), "--since",
            f"{(end - start) / 1000:.3f}s", "--until", f"{end / 1000:.3f}", "--set", "num-gpu-blocks=80"]
    table = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "the model's replay of the window" in table.stdout and "asked" in table.stdout
    markdown = subprocess.run(argv + ["--format", "markdown"], capture_output=True, text=True, timeout=120)
    assert markdown.stdout.startswith("# What if") and "| goodput req/s |" in markdown.stdout
    query = WhatIfQuery(start, end, None, (("num-gpu-blocks", "80"),))
    with Store.open(session["path"], read_only=True) as store:
        routed = daemon_route_whatif()(store, query.as_params())
    assert routed["scenarios"] == _doc(session, "kv_cache_pressure", (("num-gpu-blocks", "80"),))["scenarios"]
    bad = subprocess.run(argv[:-2] + ["--set", "gpu-count=2"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a knob" in bad.stderr
    assert "Traceback" not in bad.stderr
    empty = subprocess.run(argv[:-2] + ["--until", f"{(start - 3_600_000) / 1000:.0f}"], capture_output=True,
                           text=True, timeout=120)
    assert empty.returncode == 1 and "Traceback" not in empty.stderr, empty.stderr


def test_a_scrape_gap_longer_than_a_bin_loses_no_requests(session: dict, tmp_path: Path) -> None:
    """A starved scraper stored nothing for 14 s of the kv window: the window's totals still count every request
    and token (read across the window; bins of 10 s summed would lose what no bin holds two samples of)."""
    import gzip

    from vllm_sentinel.agent.diagnosis.capacity_bins import merged, read_bins
    from vllm_sentinel.agent.diagnosis.sim_workload import FAMILIES
    from vllm_sentinel.agent.store.ingest import ingest_file

    start, end = session["phases"]["kv_cache_pressure"]
    gap = (start + 30_000, start + 44_000)
    gapped = tmp_path / "gapped.prom"
    with gzip.open(default_recording(), "rt") as src, gapped.open("w") as out:
        for line in src:
            ts = line.rsplit(" ", 1)[-1]
            if line.startswith("#") or not ts.strip().isdigit() or not gap[0] < int(ts) < gap[1]:
                out.write(line)
    with Store.open(tmp_path / "gapped.duckdb") as store:
        ingest_file(store, gapped)
        w = read_workload(Engine(store), None, start, end)
        summed = merged(read_bins(Engine(store), start, end, 10_000, w.instance, FAMILIES))
    with Store.open(session["path"], read_only=True) as store:
        full = read_workload(Engine(store), None, start, end)
    for name in ("requests", "generation_tokens", "preemptions"):
        assert w.measured.rate(name) == pytest.approx(full.measured.rate(name), rel=0.05), name
    # the bins' sum is what the window's figures were read from before: it lost a share of the requests
    assert summed.increases["requests"] < 0.9 * w.measured.tally.increases["requests"]


def worker_slowed(tmp_path: Path, spans: list[tuple[int, int]], share: float) -> Path:
    """A store of the recording whose worker CPU counter grows at `share` of its recorded pace inside each
    (start, end] of `spans` (the rest of its core taken by other work), with its configuration snapshots."""
    import gzip

    from vllm_sentinel.agent.demo.replay import restore_snapshots
    from vllm_sentinel.agent.store.ingest import ingest_file

    path, lost, last = tmp_path / "slowed.prom", 0.0, None
    with gzip.open(default_recording(), "rt") as src, path.open("w") as out:
        for line in src:  # the recording is in time order: one pass keeps the counter monotonic
            if line.startswith("vllm_sentinel_process_cpu_seconds_total{") and 'role="worker"' in line:
                series, value, ts = line.rsplit(" ", 2)
                v = float(value)
                if last is not None and any(a < int(ts) <= b for a, b in spans):
                    lost += (v - last) * (1 - share)
                last = v
                line = f"{series} {v - lost} {ts}"
            out.write(line)
    with Store.open(tmp_path / "slowed.duckdb") as store:
        ingest_file(store, path)
        restore_snapshots(store, load_metadata(default_recording()))
    return tmp_path / "slowed.duckdb"


def test_a_window_whose_busy_waiting_worker_lost_its_core_is_withheld(session: dict, tmp_path: Path) -> None:
    """On the CPU backend vLLM's worker busy-waits on a core while requests run (the recording's kv window: 91 %
    of one in its median bin). Where it ran at half that pace, something else had the core and the window's step times are not the
    server's: the calibration says so and nothing is predicted."""
    start, end = session["phases"]["kv_cache_pressure"]
    doc = _doc(session, "kv_cache_pressure")
    assert doc["calibration"]["worker_busy"] == pytest.approx(0.91, abs=0.05) and doc["withheld"] is None
    said = f"worker ran {doc['calibration']['worker_busy']:.0%} of a core"
    assert any(said in n for n in doc["calibration"]["notes"]), doc["calibration"]["notes"]
    slowed = worker_slowed(tmp_path, [(start - 60_000, end + 60_000)], 0.5)
    with Store.open(slowed, read_only=True) as store:
        doc = whatif(Engine(store), store_configs(store, start, end), WhatIfQuery(start, end, None, ()))
    assert doc["calibration"]["worker_busy"] == pytest.approx(0.45, abs=0.05)
    said = f"worker ran {doc['calibration']['worker_busy']:.0%} of a core in the window"
    assert doc["withheld"] and said in doc["withheld"], doc["withheld"]
    assert all(sc["predicted"] is None for sc in doc["scenarios"])
    # a GPU's worker does not busy-wait on its CPU: the same reading says nothing there
    with Store.open(slowed, read_only=True) as store:
        configs = store_configs(store, start, end)
        gpu = lambda inst: (lambda v: v and ({**v[0], "platform": "cuda"}, v[1]))(configs(inst))
        doc = whatif(Engine(store), gpu, WhatIfQuery(start, end, None, ()))
    assert doc["calibration"]["worker_busy"] is None and doc["withheld"] is None


def test_goodput_is_predicted_as_compare_will_read_it(session: dict) -> None:
    """The model counts goodput at the bucket bounds compare reads the server's histograms at (a 2 s TTFT
    objective on vLLM's buckets reads at 1 s): the replay of the kv window as configured predicts the goodput
    the server's own buckets give for that window."""
    import math

    from vllm_sentinel.agent.diagnosis.compare_slo import Objectives, attainment

    doc = _doc(session, "kv_cache_pressure")
    assert doc["objectives"]["read_at"] == {"ttft_s": 1.0, "tpot_s": 0.1}
    start, end = session["phases"]["kv_cache_pressure"]
    with Store.open(session["path"], read_only=True) as store:
        m = read_workload(Engine(store), None, start, end).measured
    share = attainment(m.tally.buckets["ttft"], m.tally.buckets["itl"], Objectives(2.0, 0.1))
    measured = m.rate("requests") * share
    predicted = doc["scenarios"][0]["predicted"]["goodput_rps"]
    assert math.isclose(predicted, measured, rel_tol=CALIBRATION_BOUND, abs_tol=0.1), (predicted, measured)


def test_a_starved_frontend_is_measured_and_said_beside_the_calibration() -> None:
    """The API server's handler mean past vLLM's e2e mean: 12 clients' requests waited in a CPU-starved frontend
    (bench/whatif_restarts.py, --max-num-batched-tokens 128: handler 2.04 s, e2e 1.08 s, the clients 3.92 s)."""
    from vllm_sentinel.agent.diagnosis.capacity_bins import Bin
    from vllm_sentinel.agent.diagnosis.sim_workload import Measured
    from vllm_sentinel.reports.whatif_view import frontend_note, whatif_markdown

    tally = Bin(seconds=40, instance="a", end_ms=0,
                increases={"http_sum": 220.3, "http_count": 108.0, "e2e_sum": 116.6, "e2e_count": 108.0})
    assert Measured(40, tally).frontend_s() == pytest.approx(0.96, abs=0.01)
    assert Measured(40, Bin(seconds=40, instance="a", end_ms=0, increases={"e2e_sum": 1, "e2e_count": 1})).frontend_s() is None
    doc = {"window": {"start": "s", "end": "e"}, "instance": "a", "objectives": {"ttft_p95_s": 2, "tpot_p95_s": 0.1,
           "source": "default"}, "workload": {"requests": 108, "mode": "closed loop", "clients": 4,
           "prompt_tokens_mean": 204, "output_tokens_mean": 200, "frontend_s": 0.96},
           "calibration": {"measured": {}, "modelled": {}, "error": {}}, "withheld": "too short", "scenarios": []}
    assert "held each generation request 0.96 s" in whatif_markdown(doc)
    assert frontend_note({**doc, "workload": {**doc["workload"], "frontend_s": 0.01}}) is None


def test_a_latency_p95_the_buckets_cannot_tell_from_the_measured_p90_p99_passes() -> None:
    from vllm_sentinel.agent.diagnosis.capacity_bins import Bin
    from vllm_sentinel.agent.diagnosis.sim_calibrate import judge
    from vllm_sentinel.agent.diagnosis.sim_workload import Measured

    # 80 requests under 1 s, 13 in (1, 2.5], 7 in (2.5, 5]: p95 3.21 s as interpolated; between 1 and 2.5 s the
    # share under rises from 80 % to 93 %, so a p95 anywhere there may be the measured p90..p99
    measured = Measured(60, Bin(seconds=60, instance="a", end_ms=0,
                                buckets={"ttft": {1.0: 80, 2.5: 93, 5.0: 100, float("inf"): 100}}))
    assert measured.quantile("ttft", 0.95) == pytest.approx(3.214, abs=0.01)
    for modelled in (1.9, 2.2, 4.9):  # 41 %, 32 % and 52 % off the interpolated p95
        over, notes = judge({"ttft_p95_s": relative_error(modelled, 3.214, 0.05), "preemptions_per_s": 0.1},
                            {"ttft_p95_s": modelled}, measured)
        assert over == [] and len(notes) == 1, (modelled, over)
    assert "between vLLM's bounds 1 and 2.5 s, where the measured share of requests goes from 80% to 93%" in \
        judge({"ttft_p95_s": 0.4}, {"ttft_p95_s": 1.9}, measured)[1][0]
    # under 1 s lie 80 % of the requests at most: never the p90
    over, notes = judge({"ttft_p95_s": relative_error(0.9, 3.214, 0.05), "preemptions_per_s": 0.45},
                        {"ttft_p95_s": 0.9}, measured)
    assert [k for k, _e in over] == ["ttft_p95_s", "preemptions_per_s"] and notes == []
    # a restart measured on the 2-core host: 91 % of TTFTs in (0.75, 1] s, 9 % in (1, 2.5] (p95 1.68 s as
    # interpolated); the model's 0.98 s is as close as those buckets tell
    restart = Measured(45, Bin(seconds=45, instance="a", end_ms=0,
                               buckets={"ttft": {0.75: 0, 1.0: 91, 2.5: 100, float("inf"): 100}}))
    assert restart.quantile("ttft", 0.95) == pytest.approx(1.66, abs=0.02)
    assert judge({"ttft_p95_s": relative_error(0.98, 1.66, 0.05)}, {"ttft_p95_s": 0.98}, restart)[0] == []
    assert judge({"ttft_p95_s": relative_error(0.7, 1.66, 0.05)}, {"ttft_p95_s": 0.7}, restart)[0] != []


def test_a_closed_loops_clients_are_dealt_over_replicas_and_idle_replicas_add_nothing(session: dict) -> None:
    """12 clients over 5 replicas are two replicas of 3 and three of 2 (not 5 of 3: 15 clients); over 24
    replicas, 12 replicas of 1 and 12 idle, serving what 12 replicas serve."""
    import dataclasses

    from vllm_sentinel.agent.diagnosis.sim_calibrate import replica_groups

    start, end = session["phases"]["kv_cache_pressure"]
    with Store.open(session["path"], read_only=True) as store:
        w = dataclasses.replace(read_workload(Engine(store), None, start, end), clients=12)
    assert replica_groups(w, 1.0, 5) == [(3, 2), (2, 3)]
    assert replica_groups(w, 1.0, 24) == [(1, 12)] and replica_groups(w, 1.5, 4) == [(5, 2), (4, 2)]
    assert replica_groups(dataclasses.replace(w, clients=None), 1.0, 5) == [(None, 5)]

    def served(replicas: int) -> dict:
        with Store.open(session["path"], read_only=True) as store:
            q = WhatIfQuery(start, end, None, replicas=replicas)
            return whatif(Engine(store), store_configs(store, start, end), q)["scenarios"][1]["predicted"]
    twelve, twenty_four = served(12), served(24)
    assert twenty_four["requests_per_s"] == pytest.approx(twelve["requests_per_s"], rel=0.02)
    assert twenty_four["generation_tokens_per_s"] == pytest.approx(twelve["generation_tokens_per_s"], rel=0.02)
