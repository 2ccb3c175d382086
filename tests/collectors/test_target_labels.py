"""collectors/target_labels.py and VllmCollector's labels/retire, on a real vLLM 0.32 capture."""

from __future__ import annotations

from pathlib import Path

from vllm_sentinel.collectors.target_labels import TargetLabels
from vllm_sentinel.collectors.vllm import Response, VllmCollector

CAPTURE = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu-one-request.prom.txt"


def test_target_labels_merge_as_prometheus_honor_labels_false():
    t = TargetLabels({"job": "vllm", "zone": "eu-1", "empty": ""})
    assert t.text == 'job="vllm",zone="eu-1"'  # an empty value is no label
    assert t.apply('model_name="m",job="scraped"') == 'exported_job="scraped",job="vllm",model_name="m",zone="eu-1"'
    assert t.apply("") == 'job="vllm",zone="eu-1"'
    assert TargetLabels({}).apply('a="1"') == 'a="1"'


def test_collector_carries_target_labels_and_retire_ends_every_series():
    body = CAPTURE.read_bytes()
    c = VllmCollector("http://127.0.0.1:8000", labels={"job": "vllm", "zone": "eu-1"},
                      fetch=lambda url, timeout, limit: Response(200, "text/plain; version=0.0.4", body))
    batch = c.collect(1_000)
    assert batch.status.ok
    assert all('job="vllm"' in lt and 'zone="eu-1"' in lt for lt in batch.labels)
    live = {(m, lt) for m, lt, v in zip(batch.metrics, batch.labels, batch.values) if v is not None}
    gone = c.retire(2_000)
    assert all(v is None for v in gone.values)
    assert set(zip(gone.metrics, gone.labels)) == live  # every series scraped, up and scrape_* included
    assert ("up", 'job="vllm",zone="eu-1"') in live
