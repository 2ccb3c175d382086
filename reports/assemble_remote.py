"""A report's data for an incident found in a Prometheus: evidence charted from query_range, the
configuration the metrics show, the other incidents of the same evaluation.

The remote counterpart of reports/assemble.py: what only the sidecar records (py-spy stacks, vLLM
profiler traces, the process command line) is not in Prometheus, and the report says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_sentinel.agent.promql.remote import RemoteEngine, instant_all
from vllm_sentinel.agent.promql.scope import Matcher
from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms
from vllm_sentinel.reports.assemble import RELATED_LIMIT, charted_evidence, incident_window, snapshot_from_config
from vllm_sentinel.reports.markdown import ReportData

NO_STACKS = ("Stacks: Prometheus holds metrics only; py-spy captures are taken by the sidecar (`vllm-sentinel run`) "
             "beside the server, so where the processes spent their time was not checked.")
NO_GPU = ("GPU counters: Prometheus holds no DCGM series for this instance (dcgm-exporter not scraped, or its "
          "`instance` label is the exporter's, not vLLM's), so GPU utilisation, memory and bandwidth were not checked.")


def _has_gpu_series(engine: RemoteEngine, instance: str | None, window: tuple[int, int]) -> bool:
    """True when the Prometheus holds DCGM utilisation for this instance around the incident."""
    if not instance:
        return False
    scoped = RemoteEngine(engine.client, engine.selector + (Matcher("instance", "=", instance),))
    span_s = max(1, (window[1] - window[0]) // 1000)
    [result] = instant_all(scoped, [(f"count(last_over_time(DCGM_FI_DEV_GPU_UTIL[{span_s}s]))", window[1])])
    return bool(result)


def assemble_remote(engine: RemoteEngine, incident: dict, *, now_ms: int, config: dict | None,
                    related: Sequence[dict] = (), rules: Sequence[Any] | None = None) -> ReportData:
    """Everything the report on `incident` shows, read from the Prometheus behind `engine`.

    `config` is the instance's entry of the remote diagnose document's `config` ({values, sources}).
    """
    start, window = incident_window(incident, now_ms)
    missing: list[str] = []
    exprs, descriptions, series = charted_evidence(None, incident, rules, window, engine, missing)
    snapshot = None
    if config:
        snapshot = snapshot_from_config(now_ms, config.get("values") or {}, config.get("sources") or {})
        snapshot.source = "the metrics in Prometheus (vllm:cache_config_info, behaviour; see each value's origin)"
    else:
        missing.append(f"Configuration: Prometheus holds no vllm:cache_config_info for {incident.get('instance')}, "
                       "so the fixes could not be checked against the engine's values.")
    if not _has_gpu_series(engine, incident.get("instance"), window):
        missing.append(NO_GPU)
    missing.append(NO_STACKS)
    others = [i for i in related if i["id"] != incident["id"] and _overlaps(i, window)]
    others.sort(key=lambda i: (i.get("instance") != incident.get("instance"), i["start"], i["id"]))
    return ReportData(incident=incident, window_ms=window, generated_ms=now_ms, source=engine.source,
                      evidence_series=series, evidence_exprs=exprs, evidence_descriptions=descriptions,
                      config=snapshot, fixes=list(incident.get("fixes") or []), related=others[:RELATED_LIMIT],
                      missing=missing)


def _overlaps(incident: dict, window: tuple[int, int]) -> bool:
    """True when the incident was firing at some time inside the charted window."""
    end = parse_rfc3339_ms(incident["end"]) if incident.get("end") else None
    return parse_rfc3339_ms(incident["start"]) <= window[1] and (end is None or end >= window[0])
