"""A target's batch layout (the same series in the same order every scrape) reused for its series ids.

Whatever path a tick takes, what is stored must be exactly what the batches said: each sample under
the series its metric and labels name, at its time, with its value.
"""

from __future__ import annotations

import pytest

from vllm_sentinel.agent.store.db import HOUR_MS, SamplesRejected, Store, StoreUnwritable
from vllm_sentinel.collectors.base import Batch

T0 = 1_795_000_000_000 - (1_795_000_000_000 % HOUR_MS)


def scrape(instance: str, ts: int, series: list[tuple[str, str]], base: float = 0.0) -> Batch:
    b = Batch(instance=instance, ts_ms=ts)
    for i, (metric, labels) in enumerate(series):
        b.add(metric, labels, base + i)
    return b


def stored(s: Store) -> list[tuple]:
    return s.con.execute(
        "SELECT se.instance, se.metric, se.labels_text, x.ts, x.value FROM samples x JOIN series se USING (series_id) "
        "ORDER BY 1, 2, 3, 4").fetchall()


def expected(batches: list[Batch]) -> list[tuple]:
    rows = []
    for b in batches:
        for metric, labels, value, t in zip(b.metrics, b.labels, b.values, b.timestamps_ms):
            rows.append((b.instance, metric, labels, b.ts_ms if t is None else t, value))
    return sorted(rows)


SERIES = [("vllm:num_requests_running", 'engine="0"'), ("vllm:prompt_tokens_total", 'engine="0"'),
          ("vllm:generation_tokens_total", 'engine="0"')]


def test_repeated_and_changing_layouts_store_exactly_what_each_batch_said(tmp_path):
    grown = SERIES[:1] + [("vllm:num_requests_waiting", 'engine="0"')] + SERIES[1:]  # a series appears mid-list
    relabelled = [(m, 'engine="1"') for m, _ in SERIES]  # same names, other labels: other series
    process = [("process_cpu_seconds_total", 'role="api_server"')]  # a second collector of the same instance
    ticks = [
        [scrape("a", T0, SERIES), scrape("b", T0, SERIES, 100), scrape("a", T0, process, 7)],
        [scrape("a", T0 + 1000, SERIES, 1), scrape("b", T0 + 1000, SERIES, 101), scrape("a", T0 + 1000, process, 8)],
        [scrape("a", T0 + 2000, grown, 2), scrape("b", T0 + 2000, relabelled, 102)],
        [scrape("a", T0 + 3000, SERIES, 3), scrape("b", T0 + 3000, SERIES, 103), scrape("a", T0 + 3000, process, 9)],
        [scrape("a", T0 + 4000, list(reversed(SERIES)), 4), scrape("b", T0 + 4000, SERIES, 104)],
    ]
    with Store.open(tmp_path / "s.duckdb") as s:
        for tick in ticks:
            s.append_many(tick)
        assert stored(s) == expected([b for tick in ticks for b in tick])
        assert s.series_count == 3 + 1 + 1 + 3 + 3  # a's, a's waiting, a's process, b's, b's engine="1"


def test_a_batch_at_a_time_the_store_refuses_is_refused_whole_even_with_a_known_layout(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        s.append(scrape("a", T0, SERIES))
        s.append(scrape("a", T0 + 1000, SERIES))
        bad = scrape("a", -5_000, SERIES)  # before 1970: the layout is known, the time is not storable
        rejected: list = []
        s.append_many([bad, scrape("b", T0 + 2000, SERIES)], rejected=rejected)
        assert [(r.instance, r.reason, r.count) for r in rejected] == [("a", "timestamp", 3)]
        good = [scrape("a", T0, SERIES), scrape("a", T0 + 1000, SERIES), scrape("b", T0 + 2000, SERIES)]
        assert stored(s) == expected(good)


@pytest.mark.parametrize("failure", ["refused", "unwritable"])
def test_ids_handed_out_in_a_failed_call_are_not_reused_through_a_layout(tmp_path, monkeypatch, failure):
    with Store.open(tmp_path / "s.duckdb") as s:
        s.append(scrape("a", T0, SERIES))
        new = SERIES + [("vllm:num_preemptions_total", 'engine="0"')]
        broken = scrape("a", T0 + 1000, new)
        if failure == "refused":
            broken.add("vllm:x", 'engine="0",engine="1"', 1.0)  # a repeated label name: the whole call is refused
            with pytest.raises(SamplesRejected):
                s.append_many([broken])
        else:  # the file cannot be written (the real full disk is tests/agent/store/test_db_disk_full.py)
            def full(*args):
                raise StoreUnwritable("cannot write: No space left on device")
            monkeypatch.setattr(s, "_write", full)
            with pytest.raises(StoreUnwritable):
                s.append_many([broken])
            monkeypatch.undo()
        other = [("vllm:kv_cache_usage_perc", 'engine="0"')] + SERIES  # takes the id the failed call handed out
        ticks = [scrape("b", T0 + 2000, other), scrape("a", T0 + 3000, new), scrape("a", T0 + 4000, new),
                 scrape("b", T0 + 5000, other)]
        for b in ticks:
            s.append(b)
        assert stored(s) == expected([scrape("a", T0, SERIES)] + ticks)
        ids = s.con.execute("SELECT count(DISTINCT series_id), count(*) FROM series").fetchone()
        assert ids == (s.series_count, s.series_count)


def test_samples_with_their_own_timestamps_keep_them(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as s:
        batches = []
        for k in range(3):
            b = scrape("a", T0 + k * 1000, SERIES, k)
            b.timestamps_ms[1] = T0 + k * 1000 - 500  # one sample carries its own time
            batches.append(b)
            s.append(b)
        assert stored(s) == expected(batches)
