"""agent/demo/recording.py: a window of the store -> a timestamped text dump that `ingest` reads back unchanged."""

from __future__ import annotations

import gzip
import math

import pytest

from vllm_sentinel.agent.store.ingest import ingest_file
from vllm_sentinel.agent.demo.recording import export_window, format_value, sample_line
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.collectors.base import Batch

T0 = 1_700_000_000_000
INST = "127.0.0.1:8000"
ROWS = ("SELECT instance, metric, source_metric, labels_text, ts, value FROM samples JOIN series USING (series_id) "
        "WHERE value IS NOT NULL ORDER BY ALL")


def _store(n: int = 6) -> Store:
    s = Store.open(":memory:")
    for i in range(n):
        b = Batch(instance=INST, ts_ms=T0 + i * 1000)
        b.add("vllm:num_requests_waiting", 'engine="0",model_name="m"', float(i))
        b.add("vllm:request_queue_time_seconds_bucket", 'engine="0",le="+Inf",model_name="m"', 0.125 * i)
        b.add("vllm:cache_config_info", 'block_size="128",num_gpu_blocks="8"', 1.0)
        b.add("up", "", 1.0)
        b.add("python_gc_objects_collected_total", 'generation="0"', 3.0)
        b.add("vllm:odd", 'path="a\\"b\\\\c"', None if i == 3 else float(i) + 0.5)  # a stale marker at i=3
        s.append(b)
    other = Batch(instance="10.0.0.2:8000", ts_ms=T0)
    other.add("up", "", 0.0)
    s.append(other)
    return s


def test_round_trip_through_ingest_keeps_every_sample_but_the_dropped(tmp_path):
    src = _store()
    res = export_window(src, T0 - 1, T0 + 60_000, tmp_path / "w.prom.gz")
    assert res.dropped_metrics == ["python_gc_objects_collected_total"]
    assert res.series == 6 and res.samples == 6 * 4 + 5 + 1  # the stale marker has no spelling: left out
    dst = Store.open(":memory:")
    got = ingest_file(dst, res.path)
    assert got.instances == ["10.0.0.2:8000", INST]
    want = [r for r in src.cursor().execute(ROWS).fetchall() if not r[1].startswith("python_gc")]
    assert dst.cursor().execute(ROWS).fetchall() == want


def test_window_instance_and_thinning(tmp_path):
    src = _store()
    res = export_window(src, T0, T0 + 3000, tmp_path / "w.prom", instance=INST, drop=())
    text = (tmp_path / "w.prom").read_text()
    stamps = {int(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if not ln.startswith("#")}
    assert stamps == {T0 + 1000, T0 + 2000, T0 + 3000}  # (start, end]: the start is excluded
    assert "10.0.0.2" not in text and "python_gc_objects_collected_total" in text
    assert res.samples == 3 * 6 - 1  # ts T0+1000..T0+3000, minus the stale marker at T0+3000
    thin = export_window(src, T0 - 1, T0 + 60_000, tmp_path / "t.prom.gz", instance=INST, min_step_ms=2000)
    lines = [ln for ln in gzip.open(thin.path, "rt").read().splitlines() if ln.startswith("up{")]
    assert [int(ln.rsplit(" ", 1)[1]) for ln in lines] == [T0, T0 + 2000, T0 + 4000]


def test_families_stay_contiguous_and_gzip_is_reproducible(tmp_path):
    src = _store()
    a = export_window(src, T0 - 1, T0 + 60_000, tmp_path / "a.prom.gz")
    b = export_window(src, T0 - 1, T0 + 60_000, tmp_path / "b.prom.gz")
    assert a.path.read_bytes() == b.path.read_bytes()
    names = [ln.split("{", 1)[0] for ln in gzip.open(a.path, "rt").read().splitlines()[1:]]
    firsts = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert len(firsts) == len(set(firsts))  # each metric appears in one run of lines


def test_empty_window_is_refused(tmp_path):
    with pytest.raises(ValueError, match="empty window"):
        export_window(_store(), T0, T0, tmp_path / "x.prom")


@pytest.mark.parametrize("value,text", [(3.0, "3"), (0.25, "0.25"), (-2.0, "-2"), (math.inf, "+Inf"),
                                        (-math.inf, "-Inf"), (math.nan, "NaN"), (1e-05, "1e-05"),
                                        (1e20, "1e+20")])
def test_format_value(value, text):
    assert format_value(value) == text


def test_sample_line_adds_instance():
    assert sample_line("up", "", INST, 0.0, T0) == f'up{{instance="{INST}"}} 0 {T0}'
