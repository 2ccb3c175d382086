"""Configuration changes and restarts found in the metrics alone, over an ingested Prometheus text dump.

Each case is a real text dump with millisecond timestamps (what `vllm-sentinel ingest FILE` reads),
loaded by the real ingest path into an in-memory store: a vLLM server scraped every 2 s (a few
hundred ms of jitter), its cache_config_info, counters, gauges and latency histograms; between
phases it may go quiet (no sample at all), restart (counters from zero, a new process start time)
and come back with other cache_config_info labels.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from vllm_sentinel.agent.diagnosis.change_points import ChangePoint, find_changes, gap_in, info_config_at
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import ingest_text

INSTANCE = "10.0.0.7:8000"
T0 = 1_795_100_000_000
SCRAPE_MS = 2_000
OLD = {"block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "True", "gpu_memory_utilization": "0.9",
       "num_gpu_blocks": "9000", "num_gpu_blocks_override": "None"}
NEW = {**OLD, "gpu_memory_utilization": "0.95", "num_gpu_blocks": "12000"}
TTFT_BOUNDS = ("0.1", "0.5", "1.0", "2.5", "5.0", "+Inf")
TPOT_BOUNDS = ("0.025", "0.05", "0.1", "0.25", "+Inf")


@dataclass
class Phase:
    """One stretch of a server's life: how long, its cache config, whether it begins as a new process."""

    seconds: int
    cache: dict[str, str] = field(default_factory=lambda: dict(OLD))
    restarted: bool = False  # its counters count from zero
    start_time_s: int | None = None  # process_start_time_seconds (None: not exported)
    gap_before_s: int = 0  # no sample at all for this long before the phase (besides a scrape interval)
    ttft_share_fast: float = 0.6  # requests under 1 s


@dataclass
class Dump:
    """The text, and when each phase's first and last samples were taken."""

    text: str
    spans: list[tuple[int, int]]

    @property
    def stretch(self) -> tuple[int, int]:
        """(just before the first sample, the last sample)."""
        return self.spans[0][0] - 1, self.spans[-1][1]


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def dump(*phases: Phase, seed: int = 11) -> Dump:
    """A Prometheus text dump of one server living through `phases` (2 requests/s, jittered, seeded)."""
    rng = random.Random(seed)
    base = {"instance": INSTANCE}
    vllm = {"engine": "0", "model_name": "m", **base}
    totals: dict[str, float] = {}
    lines: list[str] = []
    spans = []
    t = T0
    for n, phase in enumerate(phases):
        t += phase.gap_before_s * 1000 if n else 0
        if phase.restarted:
            totals = {}
        end = t + phase.seconds * 1000
        first = None
        while t <= end:
            ts = t + rng.randrange(0, 300)
            first = first or ts
            done = 2 * SCRAPE_MS / 1000 * rng.uniform(0.8, 1.2)
            samples = _scrape(totals, done, phase, rng, vllm, base)
            lines += [f"{series} {value:.17g} {ts}" for series, value in samples]
            last, t = ts, t + SCRAPE_MS
        spans.append((first, last))
    # series by series, each in time order: what promtool's backfill wants (and ingest takes too)
    lines.sort(key=lambda line: (line.rsplit(" ", 2)[0], int(line.rsplit(" ", 1)[1])))
    return Dump("\n".join(lines) + "\n", spans)


def _scrape(totals: dict[str, float], done: float, phase: Phase, rng: random.Random, vllm: dict[str, str],
            base: dict[str, str]) -> list[tuple[str, float]]:
    """One scrape's samples: counters grown by `done` requests, the gauges, histograms and info series."""
    def count(series: str, add: float) -> tuple[str, float]:
        totals[series] = totals.get(series, 0.0) + add
        return series, totals[series]

    v = _labels(vllm)
    out = [(f"up{{{_labels(base)}}}", 1.0),
           (f"vllm:cache_config_info{{{_labels({'engine': '0', **phase.cache, **base})}}}", 1.0),
           (f"vllm:num_requests_running{{{v}}}", float(rng.randint(2, 4))),
           (f"vllm:num_requests_waiting{{{v}}}", float(rng.randint(0, 2))),
           (f"vllm:kv_cache_usage_perc{{{v}}}", rng.uniform(0.5, 0.7)),
           count(f'vllm:request_success_total{{{v},finished_reason="stop"}}', done),
           count(f"vllm:prompt_tokens_total{{{v}}}", 200 * done),
           count(f"vllm:generation_tokens_total{{{v}}}", 100 * done),
           count(f"vllm:num_preemptions_total{{{v}}}", 0.0)]
    fast = phase.ttft_share_fast
    for name, bounds, shares in (("vllm:time_to_first_token_seconds", TTFT_BOUNDS, (0.2, fast - 0.2, fast, 0.95, 1, 1)),
                                 ("vllm:request_time_per_output_token_seconds", TPOT_BOUNDS, (0.3, 0.8, 1, 1, 1))):
        out += [count(f'{name}_bucket{{{v},le="{le}"}}', done * share) for le, share in zip(bounds, shares)]
        out += [count(f"{name}_count{{{v}}}", done), count(f"{name}_sum{{{v}}}", done * 0.5)]
    if phase.start_time_s is not None:
        out.append((f"process_start_time_seconds{{{_labels(base)}}}", float(phase.start_time_s)))
    return out


def loaded(d: Dump) -> Store:
    """The dump in an in-memory store, through `ingest`."""
    store = Store.open(":memory:")
    result = ingest_text(store, d.text, None, T0)
    assert result.skipped == 0 and result.instances == [INSTANCE]
    return store


def changes(d: Dump) -> list[ChangePoint]:
    store = loaded(d)
    try:
        return find_changes(Engine(store), INSTANCE, *d.stretch)
    finally:
        store.close()


def user_case() -> Dump:
    """What the user ingested: 5 minutes, then a minute without samples, then a restart with a larger KV cache
    (90 % of requests under 1 s to the first token, 60 % before)."""
    return dump(Phase(300), Phase(300, dict(NEW), restarted=True, gap_before_s=60, ttft_share_fast=0.9))


def test_a_relabelled_cache_config_info_after_a_gap_is_a_configuration_change_and_a_restart() -> None:
    d = user_case()
    found = changes(d)
    resumed = d.spans[1][0]
    assert [p.kind for p in found] == ["configuration", "restart"], [p.as_dict() for p in found]
    config, restart = found
    assert abs(config.at_ms - resumed) < SCRAPE_MS and abs(restart.at_ms - resumed) < SCRAPE_MS
    assert config.shown_by == "vllm:cache_config_info labels changed"
    assert list(config.changes) == [{"param": "gpu_memory_utilization", "before": "0.9", "after": "0.95"},
                                    {"param": "num_gpu_blocks", "before": "9000", "after": "12000"}]
    # the samples stopped at the first phase's last scrape and resumed at the second's first
    assert restart.gap == (d.spans[0][1], d.spans[1][0])
    gap_s = round((d.spans[1][0] - d.spans[0][1]) / 1000)
    assert restart.shown_by == f"a gap of {gap_s} s then counters reset", restart.shown_by


def test_the_configuration_in_force_is_the_newest_label_set() -> None:
    """Just after the change the 5-minute lookback still holds the old label set: the newest sample decides."""
    d = user_case()
    store = loaded(d)
    engine = Engine(store)
    before = info_config_at(engine, INSTANCE, d.spans[0][1])
    just_after = info_config_at(engine, INSTANCE, d.spans[1][0] + 10_000)
    assert before["gpu_memory_utilization"] == "0.9" and before["num_gpu_blocks"] == "9000"
    assert just_after["gpu_memory_utilization"] == "0.95" and just_after["num_gpu_blocks"] == "12000"
    assert "engine" not in before and "instance" not in before  # which series, not what it configures
    assert info_config_at(engine, INSTANCE, T0 - 600_000) == {}
    store.close()


def test_a_process_start_time_jump_without_a_gap() -> None:
    """A quick restart between two scrapes: the start time jumps, the counters reset, no sample is missing."""
    d = dump(Phase(300, start_time_s=T0 // 1000 - 3600), Phase(300, restarted=True, start_time_s=T0 // 1000 + 299))
    [restart] = changes(d)
    assert restart.kind == "restart" and restart.gap is None
    assert restart.shown_by == "process_start_time_seconds jumped, counters reset"
    assert abs(restart.at_ms - d.spans[1][0]) < SCRAPE_MS


def test_a_start_time_jump_alone_is_a_restart() -> None:
    d = dump(Phase(300, start_time_s=T0 // 1000 - 3600), Phase(300, start_time_s=T0 // 1000 + 299))
    [restart] = changes(d)
    assert restart.shown_by == "process_start_time_seconds jumped"
    assert abs(restart.at_ms - d.spans[1][0]) < SCRAPE_MS


def test_counters_that_reset_without_any_other_sign() -> None:
    d = dump(Phase(300), Phase(300, restarted=True))
    [restart] = changes(d)
    assert (restart.kind, restart.shown_by, restart.gap) == ("restart", "counters reset", None)
    assert abs(restart.at_ms - d.spans[1][0]) < SCRAPE_MS


def test_a_gap_without_a_reset_is_a_scrape_outage_not_a_restart() -> None:
    assert changes(dump(Phase(300), Phase(300, gap_before_s=90))) == []


def test_no_change_at_all() -> None:
    assert changes(dump(Phase(600))) == []


def test_a_label_change_without_a_restart() -> None:
    """The same process reporting other labels (no gap, counters going on): a configuration change only."""
    d = dump(Phase(300), Phase(300, dict(NEW)))
    [config] = changes(d)
    assert config.kind == "configuration" and abs(config.at_ms - d.spans[1][0]) < SCRAPE_MS
    assert [c["param"] for c in config.changes] == ["gpu_memory_utilization", "num_gpu_blocks"]


def test_gaps_are_several_scrape_intervals_and_half_a_minute_at_least() -> None:
    every_15s = [0, 15_000, 30_000, 45_000, 100_000, 115_000]
    assert gap_in(every_15s, 100_000) == (45_000, 100_000)  # 55 s: over 3 intervals of 15 s
    assert gap_in([0, 15_000, 30_000, 60_000, 75_000], 60_000) is None  # 30 s: 2 intervals
    every_1s = list(range(0, 20_000, 1000)) + list(range(45_000, 60_000, 1000))
    assert gap_in(every_1s, 45_000) is None  # 26 s: many intervals, but under 30 s
    assert gap_in(every_1s, 45_000 + 60_000) is None  # nowhere near the gap


def test_a_fix_is_ranked_over_the_configuration_its_incident_fired_under() -> None:
    """An incident open across a restart: its stretch for the what-if model ends at the old server's last
    sample (the replay would mix two servers), and keeps a minute of history by reaching back."""
    from vllm_sentinel.agent.diagnosis.fix_ranking import MIN_WINDOW_MS, one_configuration

    d = user_case()
    store = loaded(d)
    try:
        first_end, second_start = d.spans[0][1], d.spans[1][0]
        incident = (first_end - 30_000, d.spans[1][1])  # fired 30 s before the restart, still firing after it
        assert one_configuration(Engine(store), INSTANCE, *incident) == (first_end - MIN_WINDOW_MS, first_end)
        # a stretch wholly after the restart is left as it is
        after = (second_start + 60_000, d.spans[1][1])
        assert one_configuration(Engine(store), INSTANCE, *after) == after
    finally:
        store.close()
