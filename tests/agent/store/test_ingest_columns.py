"""The columnar read of a dump stores exactly what the per-line read stores, and names the same bad lines.

`ingest_text` reads a plain ASCII dump as columns (collectors/dump_columns.py) and hands every line
that is not a plain `name{labels} value timestamp` to `parse`. The reference is the per-line path
(`_ingest_lines`): both read the same dumps into two real DuckDB files, and the samples (series, time,
value bits) and the results (counts, instances, span, skipped lines and the first one named) must be
equal. Dumps: a real vLLM capture stamped over several scrapes, in the text format and in OpenMetrics,
and hostile lines mixed in; a property test mixes random lines of both kinds.
"""

from __future__ import annotations

import math
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_sentinel.agent.store import ingest
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.ingest import IngestError, ingest_text
from vllm_sentinel.collectors.dump_columns import plain_enough, timed_columns
from vllm_sentinel.collectors.exposition import parse

CAPTURE = Path(__file__).parents[2] / "collectors" / "fixtures" / "vllm-0.32.0-cpu-after-preemptions.prom.txt"
T0 = 1_796_000_000_000


def stamped(scrapes: int, openmetrics: bool = False, instances: tuple[str, ...] = ("a:1", "b:2")) -> str:
    """The capture's samples as a dump: every instance, every scrape 15 s apart, counters moving."""
    parsed = parse(CAPTURE.read_text())
    lines = []
    for inst in instances:
        for i, (name, labels, value) in enumerate(zip(parsed.names, parsed.labels, parsed.values)):
            text = f'instance="{inst}"' + (f",{labels}" if labels else "")
            for k in range(scrapes):
                ts = T0 + k * 15_000 + (i % 7)
                v = value + k * (i % 3)
                stamp = f"{ts / 1000:.3f}" if openmetrics else str(ts)
                lines.append(f"{name}{{{text}}} {v!r} {stamp}")
    return "\n".join(lines) + ("\n# EOF\n" if openmetrics else "\n")


def bits(v: float) -> bytes:
    return struct.pack("<d", v)


def both(text: str, instance: str | None = "x:9", monkeypatch: pytest.MonkeyPatch | None = None,
         chunk_bytes: int | None = None) -> tuple[tuple, tuple]:
    """(result, rows) of the per-line path and of ingest_text, each into a fresh store."""
    outs = []
    with tempfile.TemporaryDirectory() as d:
        for k, read in enumerate((ingest._ingest_lines, ingest_text)):
            with Store.open(Path(d) / f"{k}.duckdb") as store:
                try:
                    if read is ingest_text:
                        if chunk_bytes is not None and monkeypatch is not None:
                            monkeypatch.setattr(ingest, "CHUNK_BYTES", chunk_bytes)
                        res = read(store, text, instance, T0 - 1)
                    else:
                        res = read(store, text, instance, T0 - 1, None)
                    result = (res.samples, res.instances, res.first_ms, res.last_ms, res.skipped, res.first_skipped)
                except IngestError as e:
                    result = ("IngestError", str(e))
                rows = store.con.execute(
                    "SELECT s.instance, s.metric, s.labels_text, s.source_metric, x.ts, x.value "
                    "FROM samples x JOIN series s USING (series_id)").fetchall()
            outs.append((result, sorted((i, m, lt, src, ts, bits(v)) for i, m, lt, src, ts, v in rows)))
    return outs[0], outs[1]


def test_a_real_capture_over_scrapes_is_stored_alike_in_text_format(monkeypatch):
    text = stamped(4)
    assert plain_enough(text.encode())
    (ref, ref_rows), (got, got_rows) = both(text)
    assert got == ref and got_rows == ref_rows
    assert ref[0] == len(ref_rows) > 1000 and ref[4] == 0
    # many chunks: heads met again in later chunks, line numbers carried across
    (_, _), (small, small_rows) = both(text, monkeypatch=monkeypatch, chunk_bytes=4096)
    assert small == ref and small_rows == ref_rows


def test_a_real_capture_is_stored_alike_in_openmetrics():
    (ref, ref_rows), (got, got_rows) = both(stamped(3, openmetrics=True))
    assert got == ref and got_rows == ref_rows and ref[0] > 1000


def test_every_line_read_as_columns_is_a_plain_timed_line():
    cols = timed_columns(stamped(2).encode(), openmetrics=False, max_ms=9_223_372_036_854)
    assert len(cols.codes) == len(stamped(2).splitlines()) and not len(cols.other_lines)
    assert len(cols.heads) == len(set(cols.heads)) < len(cols.codes)


HOSTILE = [
    "# HELP vllm:num_requests_running Number of requests.",
    "# TYPE vllm:num_requests_running gauge",
    'vllm:num_requests_running{instance="h:1",model_name="m"} 3 1796000000000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} NaN 1796000001000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} +Inf 1796000002000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} -inf 1796000003000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 1. 1796000004000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} .5 1796000005000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} +3e2 1796000006000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 1_0 1796000007000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 4 0001796000008000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 5 1796000009000.5',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 6 1.79600001e12',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 7 -5',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 8 99999999999999999',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 9 1796000010000 ',
    'vllm:num_requests_running{instance="h:1",model_name="m"}  10 1796000011000',
    'vllm:num_requests_running{instance="h:1",model_name="m"} 11',
    'odd{instance="h:1",path="a b 1 2"} 12 1796000012000',
    'odd{instance="h:1",path="a}b"} 13 1796000013000',
    'odd{instance="h:1",path="q\\"u\\\\o\\nte"} 14 1796000014000',
    'odd{instance="h:1",path="x",path="y"} 15 1796000015000',
    'odd{instance="h:1",path="x"  } 16 1796000016000',
    'odd{instance="h:1" path="x"} 17 1796000017000',
    'odd{} 18 1796000018000',
    'odd{ } 19 1796000019000',
    'odd 20 1796000020000',
    'odd_created{instance="h:1"} 1.7e9 1796000021000',
    'odd_created{instance="h:1"} nope 1796000021000',
    '9bad{instance="h:1"} 21 1796000022000',
    'vllm:gpu_cache_usage_perc{instance="h:1",model_name="m"} 0.5 1796000023000',
    'vllm:kv_cache_usage_perc{instance="h:1",model_name="m"} 0.25 1796000024000',
    'just garbage',
    '',
    'odd{instance="h:1"} 22 1796000025000 extra',
    'odd{instance="h:1"}\t23 1796000026000',
    'odd{instance="h:1"} 24\t1796000027000',
]


def test_hostile_lines_are_stored_or_named_alike():
    text = "\n".join(HOSTILE * 3) + "\n"
    assert plain_enough(text.encode())
    (ref, ref_rows), (got, got_rows) = both(text)
    assert got == ref and got_rows == ref_rows
    assert ref[4] > 0 and ref[5].startswith("line ")  # some lines are bad, and the first is named by number


def test_hostile_openmetrics_lines_are_stored_or_named_alike():
    om = [line.replace(" 17960000", " 17960000.") if line and not line.startswith("#") else line for line in HOSTILE]
    om += ['odd{instance="h:1"} 25 1796000028.000 # {trace_id="t"} 1.0 1796000028.000',
           'odd_total{instance="h:1"} 26 1796000029.0005', 'odd{instance="h:1"} 27 inf']
    text = "\n".join(om) + "\n# EOF\n\n"
    (ref, ref_rows), (got, got_rows) = both(text)
    assert got == ref and got_rows == ref_rows and ref[4] > 0


def test_a_chunk_with_indented_lines_and_a_dump_with_carriage_returns_read_alike(monkeypatch):
    lines = stamped(2).splitlines()
    indented = "\n".join(lines[:50] + ["  " + lines[50]] + lines[51:]) + "\n"
    (ref, ref_rows), (got, got_rows) = both(indented, monkeypatch=monkeypatch, chunk_bytes=2048)
    assert got == ref and got_rows == ref_rows
    crlf = "\r\n".join(lines[:40]) + "\r\n"
    assert not plain_enough(crlf.encode())
    (ref, ref_rows), (got, got_rows) = both(crlf)
    assert got == ref and got_rows == ref_rows and ref[0] == 40


def test_a_line_without_an_instance_fails_alike():
    text = 'vllm:num_requests_running{model_name="m"} 3 1796000000000\n'
    (ref, _), (got, _) = both(text, instance=None)
    assert ref[0] == "IngestError" and got == ref


_NAMES = st.sampled_from(["a", "vllm:x_total", "b_created", "c:d", "9e", ""])
_LABELS = st.sampled_from(["", "{}", '{instance="i:1"}', '{k="v"}', '{k="v w 1 2"}', '{k="}"}', '{k="a",k="b"}',
                           '{k="\\"x"}', "{k=v}", '{ k = "v" }'])
_VALUES = st.sampled_from(["1", "\t1", "-2.5", "1e3", "NaN", "+Inf", "1.", ".5", "x", "1_0", "", "0x1", "  3"])
_STAMPS = st.sampled_from(["1796000000000", "1796000000000.5", "-1", "0", "00012", "", "17960000000000000000",
                           "1.5e12", "abc", "1796000000000 9"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_NAMES, _LABELS, _VALUES, _STAMPS), min_size=1, max_size=25),
       st.booleans())
def test_random_lines_are_stored_or_named_alike(parts, openmetrics):
    lines = [" ".join(x for x in (f"{n}{lab}", v, t) if x) for n, lab, v, t in parts]
    text = "\n".join(lines) + ("\n# EOF\n" if openmetrics else "\n")
    (ref, ref_rows), (got, got_rows) = both(text)
    assert got == ref
    assert got_rows == ref_rows


def test_values_read_as_columns_are_the_floats_python_reads():
    tokens = ["0", "-0", "1.", ".5", "+7", "1e-300", "2.2250738585072014e-308", "1.7976931348623157e308",
              "123456789.123456789e-5", "0.1", "3.141592653589793238462643383279"]
    text = "".join(f'v{{instance="i:1",k="{i}"}} {t} 1796000000000\n' for i, t in enumerate(tokens))
    cols = timed_columns(text.encode(), openmetrics=False, max_ms=9_223_372_036_854)
    assert [bits(v) for v in cols.values] == [bits(float(t)) for t in tokens]
    assert not any(math.isnan(v) for v in cols.values)
