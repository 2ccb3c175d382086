"""Export a window of the store as a timestamped Prometheus text dump that `vllm-sentinel ingest` reads back.

One line per sample, `metric{labels,instance="..."} value ts_ms`, grouped by series and sorted by
time, gzip-compressed when the path ends in `.gz`. Metric names are written as they were scraped
(the store's `source_metric`), so ingest resolves aliases exactly as the live collector did.
Staleness markers have no spelling in the text format and are left out: an ingested dump is
read with the ordinary 5-minute lookback, like any dump from a customer.

    >>> sample_line("vllm:num_requests_waiting", 'engine="0"', "127.0.0.1:8000", 3.0, 1700000000000)
    'vllm:num_requests_waiting{engine="0",instance="127.0.0.1:8000"} 3 1700000000000'
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_sentinel.agent.store.sample_reads import values_between
from vllm_sentinel.agent.store.series_table import series_to_export
from vllm_sentinel.collectors.base import escape_label_value

# Series a diagnosis never reads and that only make a recording bigger: the Python runtime's and
# the HTTP server's own instrumentation.
NOISY_METRICS: tuple[str, ...] = ("python_gc_*", "python_info", "http_*")

# For the demo recording shipped in the package (kept small): also the families no rule, summary or
# report reads. process_cpu_seconds_total stays (frontend_cpu_bound reads it).
RECORDING_DROP: tuple[str, ...] = NOISY_METRICS + (
    "process_open_fds", "process_max_fds", "process_virtual_memory_bytes", "process_resident_memory_bytes",
    "process_start_time_seconds", "vllm:request_params_*", "vllm:request_max_num_generation_tokens*",
    "vllm:request_prefill_kv_computed_tokens*", "vllm:request_inference_time_seconds*",
    "vllm:request_decode_time_seconds*", "vllm:mm_cache_*", "vllm:external_prefix_cache_*",
    "vllm:engine_sleep_state", "vllm:prompt_tokens_cached_by_source*", "vllm:prompt_tokens_by_source*")

HEADER = "# vllm-sentinel recording: {n} samples of {series} series, {start} .. {end} (ms since the epoch)\n"


@dataclass
class RecordResult:
    """What an export wrote."""

    path: Path
    samples: int
    series: int
    bytes: int
    dropped_metrics: list[str] = field(default_factory=list)  # metric names left out by the drop patterns


def format_value(value: float) -> str:
    """A sample value in the text format: 3.0 -> '3', 0.25 -> '0.25', inf -> '+Inf', nan -> 'NaN'."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def sample_line(metric: str, labels_text: str, instance: str, value: float, ts_ms: int) -> str:
    """One exposition line with the instance label added to the stored label text."""
    inst = f'instance="{escape_label_value(instance)}"'
    labels = f"{labels_text},{inst}" if labels_text else inst
    return f"{metric}{{{labels}}} {format_value(value)} {ts_ms}"


def _dropped(metric: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(metric, p) for p in patterns)


def export_window(store: Any, start_ms: int, end_ms: int, path: str | Path, *, instance: str | None = None,
                  drop: Sequence[str] = NOISY_METRICS, min_step_ms: int = 0) -> RecordResult:
    """Write the samples of (start_ms, end_ms] to `path` (gzip when it ends in .gz).

    `drop` holds glob patterns of metric names to leave out (matched on both the canonical and the
    scraped name); `min_step_ms` thins each series to at most one sample per that many ms (0: keep all),
    which keeps every rate() window of at least twice that length answerable.
    """
    if end_ms <= start_ms:
        raise ValueError(f"empty window: end {end_ms} is not after start {start_ms}")
    out = Path(path)
    keep: dict[int, tuple[str, str, str]] = {}
    dropped: set[str] = set()
    for sid, inst, metric, source, labels_text in series_to_export(store, instance):
        if _dropped(metric, drop) or _dropped(source, drop):
            dropped.add(source)
            continue
        keep[int(sid)] = (source, labels_text or "", inst)
    # sort by the written line's name and labels, so each metric family stays contiguous
    order = sorted(keep, key=lambda s: keep[s])
    rank = {sid: i for i, sid in enumerate(order)}
    by_series: dict[int, list[tuple[int, float]]] = {}
    for sid, ts, value in values_between(store, start_ms, end_ms):
        sid = int(sid)
        if sid not in keep:
            continue
        points = by_series.setdefault(sid, [])
        if min_step_ms and points and ts - points[-1][0] < min_step_ms:
            continue
        points.append((int(ts), float(value)))
    buf = io.StringIO()
    n = 0
    written_series = 0
    for sid in sorted(by_series, key=rank.__getitem__):
        source, labels_text, inst = keep[sid]
        written_series += 1
        for ts, value in by_series[sid]:
            buf.write(sample_line(source, labels_text, inst, value, ts))
            buf.write("\n")
            n += 1
    text = HEADER.format(n=n, series=written_series, start=start_ms, end=end_ms) + buf.getvalue()
    out.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    if out.suffix == ".gz":
        # mtime=0: the same samples give the same bytes, so a re-recording diffs cleanly
        data = gzip.compress(data, compresslevel=9, mtime=0)
    out.write_bytes(data)
    return RecordResult(out, n, written_series, len(data), sorted(dropped))
