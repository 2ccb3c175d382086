"""Gather a report's data for one incident from the store: the incident, its evidence as ranges,
the configuration at the time, stack captures, related incidents, and what could not be checked.

Every part is optional: a table that does not exist yet, a rule pack that fails to load, a query that
fails becomes a line in `missing`, never an exception; only an unknown incident id is an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from vllm_sentinel.agent.alerts.rulepack import load_pack
from vllm_sentinel.agent.diagnosis.captures import traces_of
from vllm_sentinel.agent.diagnosis.fix_ranking import pack_objectives, rank_fixes
from vllm_sentinel.agent.diagnosis.incidents import stored_incidents
from vllm_sentinel.agent.diagnosis.liveconfig import ARGV_FLAGS
from vllm_sentinel.agent.diagnosis.whatif import store_configs
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.captures_table import captures_around
from vllm_sentinel.agent.store.config_snapshots import config_snapshot_at, first_config_snapshot
from vllm_sentinel.agent.store.db import table_exists
from vllm_sentinel.agent.store.events_table import last_capture_refusal
from vllm_sentinel.agent.store.incidents_table import incidents_by_id_prefix
from vllm_sentinel.agent.store.series_table import has_gpu_series
from vllm_sentinel.collectors.frames import LABELS, summarize
from vllm_sentinel.collectors.profiler import PROFILER_KINDS
from vllm_sentinel.collectors.pyspy import parse_folded
from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms
from vllm_sentinel.reports.markdown import ConfigSnapshot, ProcessStacks, ReportData

MIN_MARGIN_MS = 5 * 60_000  # context around the incident on the charts: at least 5 minutes each side
TARGET_POINTS = 240  # points per line on a chart: smooth at ~1000 px, cheap to query
NICE_STEPS_MS = (1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000,
                 3_600_000)
TOP_FRAMES = 8
RELATED_LIMIT = 20


class IncidentNotFound(LookupError):
    """No incident with this id (or id prefix) is in the store."""


def incident_window(incident: dict, now_ms: int) -> tuple[int, tuple[int, int]]:
    """An incident dict's start (ms) and the window its charts show, as of `now_ms`."""
    start = parse_rfc3339_ms(incident["start"])
    end = parse_rfc3339_ms(incident["end"]) if incident.get("end") else None
    return start, chart_window(start, end, max(now_ms, end or start))


def chart_window(start_ms: int, end_ms: int | None, now_ms: int) -> tuple[int, int]:
    """The charted range: the incident plus max(5 min, half its length) either side, never past now.

    chart_window(600_000, 660_000, 10**9) -> (300_000, 960_000)
    """
    if end_ms is None:  # still firing: chart up to now
        return start_ms - max(MIN_MARGIN_MS, (now_ms - start_ms) // 2), now_ms
    margin = max(MIN_MARGIN_MS, (end_ms - start_ms) // 2)
    return start_ms - margin, min(now_ms, end_ms + margin)


def step_for(window: tuple[int, int], points: int = TARGET_POINTS) -> int:
    """The smallest 'nice' step giving at most `points` steps: 20 min window -> 5000 ms."""
    span = max(1, window[1] - window[0])
    for step in NICE_STEPS_MS:
        if span / step <= points:
            return step
    return NICE_STEPS_MS[-1]


def load_incident(store: Any, incident_id: str) -> dict:
    """The incident with this id (a unique prefix is enough), in the diagnose JSON contract."""
    if not table_exists(store, "incidents"):
        raise IncidentNotFound(f"{store.path} has no incidents table yet: no rule has been evaluated on this "
                               "database. Run the sidecar (`vllm-sentinel run`) or `diagnose` first.")
    rows = incidents_by_id_prefix(store, incident_id)
    exact = [r for r in rows if r[0] == incident_id]
    if exact:
        rows = exact
    if not rows:
        raise IncidentNotFound(f"no incident {incident_id!r} in {store.path}. List them with "
                               "`vllm-sentinel diagnose --since 24h --format json`.")
    if len(rows) > 1:
        raise IncidentNotFound(f"{incident_id!r} matches several incidents ({', '.join(r[0] for r in rows)}); "
                               "give more of the id.")
    found_id, start_ms = rows[0]
    for inc in stored_incidents(store, start_ms - 1, start_ms):
        if inc["id"] == found_id:
            return inc
    raise IncidentNotFound(f"incident {found_id} vanished while reading {store.path}; try again.")


def _agrees(series_labels: dict[str, str], alert_labels: dict[str, str]) -> bool:
    """True when no label the two share disagrees (an evidence series of this incident's instance)."""
    return all(alert_labels[k] == v for k, v in series_labels.items() if k in alert_labels and k != "__name__")


def evidence_exprs(incident: dict, rules: Sequence[Any] | None, missing: list[str]) -> tuple[dict, dict]:
    """signal -> PromQL and signal -> description, from the incident itself or its rule."""
    exprs = {e["signal"]: e["expr"] for e in incident.get("evidence", []) if e.get("expr")}
    descriptions: dict[str, str] = {}
    wanted = [e["signal"] for e in incident.get("evidence", []) if e["signal"] not in exprs]
    if not wanted:
        return exprs, descriptions
    if rules is None:
        try:
            rules = load_pack()
        except Exception as e:  # a broken rule pack must not stop the report
            missing.append(f"Charts: the rule files could not be loaded ({e}), so the evidence was not charted.")
            return exprs, descriptions
    rule = next((r for f in rules for r in getattr(f, "rules", [f]) if r.name == incident.get("rule")), None)
    if rule is None:
        missing.append(f"Charts: rule {incident.get('rule')!r} is not in the loaded rule files (renamed or "
                       "removed since the incident), so its evidence was not charted.")
        return exprs, descriptions
    for ev in rule.evidence:
        if ev.signal in wanted:
            exprs[ev.signal] = ev.expr
            if ev.description:
                descriptions[ev.signal] = ev.description
    return exprs, descriptions


def evidence_series(store: Any, incident: dict, exprs: dict[str, str], window: tuple[int, int],
                    engine: Any, missing: list[str]) -> dict[str, list]:
    """signal -> [(labels, points)] of the incident's own series over the charted window (engine: the store's
    by default, or any other, a remote one included); a failing query costs its chart and a line in `missing`."""
    if engine is None:
        engine = Engine(store)
    alert_labels = {**(incident.get("labels") or {}), "instance": incident.get("instance")}
    step = step_for(window)
    out: dict[str, list] = {}
    for ev in incident.get("evidence", []):
        signal = ev["signal"]
        if signal not in exprs:
            continue
        try:
            result = engine.range(exprs[signal], window[0], window[1], step)
        except Exception as e:  # one bad expression costs one chart, not the report
            missing.append(f"Evidence `{signal}`: its query failed over the window ({e}).")
            continue
        lines = []
        for s in result:
            labels = {k: v for k, v in dict(s.labels).items() if k != "__name__"}
            if not _agrees(labels, alert_labels):
                continue
            pts = [(int(t), None if v is None or math.isnan(v) else float(v)) for t, v in s.points]
            lines.append((labels, pts))
        lines.sort(key=lambda lp: sorted(lp[0].items()))
        out[signal] = lines
    return out


def charted_evidence(store: Any, incident: dict, rules: Sequence[Any] | None, window: tuple[int, int], engine: Any,
                     missing: list[str]) -> tuple[dict, dict, dict]:
    """(signal -> PromQL, signal -> description, signal -> series) of an incident's evidence over `window`."""
    exprs, descriptions = evidence_exprs(incident, rules, missing)
    series = evidence_series(store, incident, exprs, window, engine, missing) if exprs else {}
    for ev in incident.get("evidence", []):
        if ev["signal"] in series and not any(any(v is not None for _, v in pts) for _, pts in series[ev["signal"]]):
            missing.append(f"Evidence `{ev['signal']}`: no samples around the incident (the metric was not "
                           "scraped, or this vLLM version does not export it).")
    return exprs, descriptions, series


def config_at(store: Any, instance: str, t_ms: int) -> ConfigSnapshot | None:
    """The configuration snapshot in force at t_ms (else the first one after it), or None."""
    row = config_snapshot_at(store, instance, t_ms) or first_config_snapshot(store, instance)
    if row is None:
        return None
    ts, config, sources = row
    config = json.loads(config) if isinstance(config, str) else dict(config or {})
    sources = json.loads(sources) if isinstance(sources, str) else dict(sources or {})
    return snapshot_from_config(ts, config, sources)


def _flag_names() -> dict[str, str]:
    """LiveConfig name -> vLLM flag ('max_num_seqs' -> '--max-num-seqs'), from liveconfig's argv table."""
    return {name: flag for flag, (name, _typ) in ARGV_FLAGS.items()}


def _origin(source: str) -> str:
    """A short origin for the config table: 'flag --max-num-seqs' -> 'command line'."""
    if source.startswith("flag "):
        return "command line"
    if source.startswith("default"):
        return "vLLM default"
    if source.startswith("inferred (") and "default" in source:
        return "inferred: vLLM default (the command line is not in the metrics)"
    if source.startswith("cache_config_info"):
        return "engine (vllm:cache_config_info)"
    if source.startswith("model config.json"):
        return "model config.json"
    if source.startswith("derived"):
        return source  # the formula is the explanation: 'derived: num_gpu_blocks x block_size'
    return source or "recorded"


def snapshot_from_config(ts_ms: int | None, config: dict, sources: dict) -> ConfigSnapshot:
    """A ConfigSnapshot from liveconfig's values and sources (LiveConfig.to_json), flags named as on the CLI.

    ({'max_num_seqs': 2, 'num_gpu_blocks': 9, 'block_size': None}, {'max_num_seqs': 'flag --max-num-seqs',
      'num_gpu_blocks': 'cache_config_info', 'block_size': 'unknown: no cache info'}) ->
    flags {'--max-num-seqs': '2'}, extra {'num_gpu_blocks': '9'}, unknown {'block_size': 'no cache info'}
    """
    to_flag = _flag_names()
    snap = ConfigSnapshot(ts_ms=ts_ms, source="", model=config.get("model"))
    used: set[str] = set()
    for name, value in sorted(config.items()):
        src = str(sources.get(name, ""))
        if name in ("model", "served_model_name") or isinstance(value, (dict, list)):
            continue
        if value is None:
            snap.unknown[name] = src.removeprefix("unknown: ") or "not recorded"
            continue
        used.add(src.split(" ")[0].split(":")[0].split("(")[0])
        text = str(value).lower() if isinstance(value, bool) else str(value)
        flag = to_flag.get(name)
        if flag is not None:
            snap.flags[flag] = text
            snap.origins[flag] = _origin(src)
            if not src.startswith("flag "):
                snap.defaulted.add(flag)  # not on the command line: left off the `vllm serve` line
        else:
            snap.extra[name] = text
            snap.origins[name] = _origin(src)
    words = {"flag": "the vLLM command line", "cache_config_info": "vllm:cache_config_info",
             "model": "the model's config.json", "default": "vLLM's defaults", "derived": "arithmetic on these"}
    order = list(words)  # most direct evidence first
    ranked = sorted((u for u in used if u), key=lambda u: (order.index(u) if u in order else len(order), u))
    snap.source = ", ".join(words.get(u, u) for u in ranked) or "the live configuration"
    return snap


def _stacks(store: Any, incident: dict, window: tuple[int, int], missing: list[str]) -> list[ProcessStacks]:
    if not table_exists(store, "captures"):
        missing.append("Stacks: this database has no captures table (stack capture not set up), so "
                       "where the processes spent their time was not checked.")
        return []
    # profiler rows hold a trace's place, not stacks: see _traces
    rows = captures_around(store, incident["id"], incident.get("instance"), window, except_kinds=PROFILER_KINDS)
    if not rows:
        why = _capture_refusal(store, incident.get("instance"), window)
        missing.append("Stacks: no py-spy capture was taken for this incident ("
                       + (why or "py-spy missing, ptrace not permitted, or rate-limited")
                       + "), so where the processes spent their time was not checked.")
        return []
    out = []
    for r in rows:
        base = {"role": r["role"], "pid": r["pid"], "kind": r["kind"], "ts_ms": r["ts"], "status": r["status"],
                "error": r.get("error")}
        if r.get("process_state") == "T":
            base["error"] = "the process was stopped (state T) when captured" + (f"; {base['error']}"
                                                                                if base["error"] else "")
        if not r.get("folded"):
            out.append(ProcessStacks(samples=int(r.get("samples") or 0), **base))
            continue
        # a record without --idle sampled only running threads: every sample is busy work
        active = True if r.get("idle_included") is False else None
        prof = summarize(parse_folded(r["folded"]), pid=r["pid"], role=r["role"], top=TOP_FRAMES, active=active)
        total = prof.samples or 1
        out.append(ProcessStacks(
            samples=prof.samples, **base,
            top_frames=[(f, n / total, LABELS.get(c, c)) for f, c, n in prof.top_frames],
            class_shares={LABELS.get(c, c): n / total for c, n in prof.class_samples.items()}))
    if all(p.status not in ("ok", "truncated") for p in out):
        missing.append("Stacks: every capture for this incident failed (see Stack evidence for why).")
    return out


def _traces(store: Any, incident: dict) -> list[dict]:
    """vLLM profiler captures linked to the incident (none unless the daemon runs with --vllm-profiler)."""
    if not table_exists(store, "captures"):
        return []
    return traces_of(store, incident["id"])


def _capture_refusal(store: Any, instance: str | None, window: tuple[int, int]) -> str | None:
    """The last reason the capture collector gave for not capturing this instance in the window, if any."""
    return last_capture_refusal(store, instance, *window)


def _related(store: Any, incident: dict, window: tuple[int, int]) -> list[dict]:
    others = [i for i in stored_incidents(store, window[0], window[1]) if i["id"] != incident["id"]]
    # this instance first: the likeliest cause or consequence
    others.sort(key=lambda i: (i.get("instance") != incident.get("instance"), i["start"], i["id"]))
    return others[:RELATED_LIMIT]


def assemble(store: Any, incident_id: str, *, now_ms: int, rules: Sequence[Any] | None = None,
             engine: Any = None, source: str = "") -> ReportData:
    """Everything the report on `incident_id` shows, read from `store` as of `now_ms`."""
    return assemble_incident(store, load_incident(store, incident_id), now_ms=now_ms, rules=rules, engine=engine,
                             source=source)


def assemble_incident(store: Any, incident: dict, *, now_ms: int, rules: Sequence[Any] | None = None,
                      engine: Any = None, source: str = "") -> ReportData:
    """The report data of an incident dict (stored, or found by a window evaluation) read from `store`."""
    start, window = incident_window(incident, now_ms)
    if "model" not in incident and incident.get("fixes"):  # a stored incident: its fixes predicted and ranked now
        incident = {**incident, "fixes": [dict(f) for f in incident["fixes"]]}
        rank_fixes(engine or Engine(store), lambda s, e: store_configs(store, s, e), [incident], window[1],
                   pack_objectives(rules))
    missing: list[str] = []
    exprs, descriptions, series = charted_evidence(store, incident, rules, window, engine, missing)

    config = None
    if not table_exists(store, "config_snapshots"):
        missing.append("Configuration: this database has no configuration snapshots, so the fixes could not "
                       "be checked against the live values.")
    else:
        config = config_at(store, incident.get("instance") or "", start)
        if config is None:
            missing.append(f"Configuration: no snapshot of {incident.get('instance')}'s configuration was "
                           "recorded (the sidecar could not read the vLLM command line or /metrics info).")

    if not has_gpu_series(store, incident.get("instance")):
        missing.append("GPU counters: no NVML series for this instance (no GPU, no driver, or the NVML "
                       "collector off), so GPU utilisation, memory and bandwidth were not checked.")
    stacks = _stacks(store, incident, window, missing)
    traces = _traces(store, incident)
    related = _related(store, incident, window)
    return ReportData(incident=incident, window_ms=window, generated_ms=now_ms,
                      source=source or f"duckdb:{store.path}", evidence_series=series, evidence_exprs=exprs,
                      evidence_descriptions=descriptions, config=config, fixes=list(incident.get("fixes") or []),
                      stacks=stacks, traces=traces, related=related, missing=missing)
