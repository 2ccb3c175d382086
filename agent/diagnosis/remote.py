"""`diagnose --prometheus URL`: the rule pack evaluated by a fleet's Prometheus, in the diagnose JSON contract.

The same replay as over the DuckDB store (agent/diagnosis/incidents.py `evaluate_rules`: one range
query per alerting rule at the rules' step, Prometheus' alert state machine stepped over the
result, evidence at each incident's peak), with every query sent to Prometheus through a
RemoteEngine scoped to the operator's selector. Which vLLM instances exist, and where the data
starts and ends, come from one coarse range query of `vllm:num_requests_running`; the
configuration behind the fixes from the metrics (agent/diagnosis/metrics_config.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.alerts.explains import causal_links
from vllm_sentinel.agent.alerts.rulemodel import RuleFile, RuleGroup
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow
from vllm_sentinel.agent.diagnosis.episodes import link_episodes
from vllm_sentinel.agent.diagnosis.fix_ranking import pack_objectives, rank_fixes
from vllm_sentinel.agent.diagnosis.incidents import evaluate_rules
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig
from vllm_sentinel.agent.diagnosis.metrics_config import metrics_configs
from vllm_sentinel.agent.diagnosis.summary import summaries
from vllm_sentinel.agent.diagnosis.window import data_bounds, window_step
from vllm_sentinel.agent.promql.remote import RemoteEngine, instant_all
from vllm_sentinel.agent.promql.scope import Matcher, format_selector
from vllm_sentinel.collectors.timefmt import iso_seconds

# every vLLM version since V0 exports it, one series per engine: presence of an instance
PRESENCE_METRIC = "vllm:num_requests_running"
PROBE_POINTS = 500  # the presence probe's resolution over the window


class RecordingRulesMissing(Exception):
    """The pack reads recording rules that the Prometheus does not hold."""


class RemoteIncidentNotFound(LookupError):
    """No incident with this id (or id prefix) in what the Prometheus' data gives for the window."""


@dataclass
class RemoteWindow:
    """What the presence probe found: instances with vLLM series, and the part of the window to evaluate."""

    instances: list[str]
    lo_ms: int
    hi_ms: int
    step_ms: int
    last_seen_ms: int  # the last probe step an instance was present at


def probe_window(engine: RemoteEngine, start_ms: int, end_ms: int, instance: str | None = None) -> RemoteWindow:
    """Instances and data bounds in (start_ms, end_ms]; NoDataInWindow naming the selector when none."""
    step = max(1000, -(-(end_ms - start_ms) // PROBE_POINTS) // 1000 * 1000)
    [series] = engine.range_many([(f"count by (instance) ({PRESENCE_METRIC})", start_ms, end_ms, step)])
    seen = {dict(s.labels).get("instance"): s.points for s in series if s.points}
    names = sorted(i for i in seen if i and (instance is None or i == instance))
    if not names:
        raise NoDataInWindow(_nothing_there(engine, start_ms, end_ms, instance, sorted(i for i in seen if i)))
    first = min(seen[n][0][0] for n in names) - step  # present at a probe step: a sample in the lookback before it
    last = max(seen[n][-1][0] for n in names)
    lo, hi = data_bounds(start_ms, end_ms, first, last)
    return RemoteWindow(names, lo, hi, window_step(lo, hi), min(last, end_ms))


def _nothing_there(engine: RemoteEngine, start_ms: int, end_ms: int, instance: str | None,
                   in_scope: list[str]) -> str:
    """The one line that says why no instance was found, and what to change."""
    when = f"between {iso_seconds(start_ms)} and {iso_seconds(end_ms)}"
    where = f"Prometheus at {engine.client.url}"
    if instance is not None and in_scope:
        return (f"no vLLM series of instance {instance} in {where} {when}; it has {', '.join(in_scope[:8])}"
                f"{' ...' if len(in_scope) > 8 else ''}. Check --instance.")
    if engine.selector:
        unscoped = RemoteEngine(engine.client)
        everywhere = unscoped.label_values("instance", PRESENCE_METRIC, start_ms, end_ms)
        sel = format_selector(engine.selector)
        if everywhere:
            return (f"--selector {sel} matches no vLLM series in {where} {when}, though it holds vLLM series of "
                    f"{len(everywhere)} instance(s) ({', '.join(everywhere[:4])}). Check --selector's labels "
                    "(`job`, `namespace`, ... as Prometheus' targets carry them).")
        return f"--selector {sel} matches no vLLM series in {where} {when}, nor does any other selector. " + _advice()
    return f"no vLLM series ({PRESENCE_METRIC}) in {where} {when}. " + _advice()


def _advice() -> str:
    return ("Widen --since/--until, and check that Prometheus scrapes vLLM's /metrics (its Status > Targets page) "
            "and that --prometheus is the right server.")


def check_recording_rules(engine: RemoteEngine, groups: list[RuleGroup], lo_ms: int, hi_ms: int) -> None:
    """Prometheus evaluates recording rules itself: refuse a pack whose recorded series it lacks."""
    names = sorted({r.name for g in groups for r in g.rules if not r.is_alert})
    if not names:
        return
    have = set(engine.client.label_values("__name__", ['{__name__=~"' + "|".join(names) + '"}'], lo_ms, hi_ms))
    missing = [n for n in names if n not in have]
    if missing:
        raise RecordingRulesMissing(
            f"the rule pack has recording rules that Prometheus at {engine.client.url} does not hold between "
            f"{iso_seconds(lo_ms)} and {iso_seconds(hi_ms)}: {', '.join(missing[:5])}. Load them into its ruler "
            "(`vllm-sentinel rules export`) or leave those files out of --rules.")


def _groups(pack: list[RuleFile] | list[RuleGroup]) -> list[RuleGroup]:
    return [g for x in pack for g in (x.groups if isinstance(x, RuleFile) else [x])]


def remote_incidents(engine: RemoteEngine, start_ms: int, end_ms: int, instance: str | None,
                     pack: list[RuleFile] | list[RuleGroup]) -> tuple[RemoteWindow, dict[str, LiveConfig], list[dict]]:
    """The probe, the inferred configurations and the incidents of the pack over the window."""
    window = probe_window(engine, start_ms, end_ms, instance)
    check_recording_rules(engine, _groups(pack), window.lo_ms, window.hi_ms)
    configs = metrics_configs(engine, window.instances, end_ms, window.step_ms, window.lo_ms)
    found = evaluate_rules(engine, window.lo_ms, window.hi_ms, instance, _groups(pack), window.step_ms,
                           config_for=lambda inst: configs.get(inst or "") or {})
    return window, configs, found


def _series_counts(engine: RemoteEngine, window: RemoteWindow) -> dict[str, int]:
    """Series per vLLM instance where its data ends (only those instances' series are touched)."""
    these = Matcher("instance", "=~", "|".join(re.escape(i) for i in window.instances))
    scoped = RemoteEngine(engine.client, engine.selector + (these,))
    [result] = instant_all(scoped, [('count by (instance) ({__name__=~".+"})', window.last_seen_ms)])
    return {s.labels.get("instance"): int(s.value) for s in result if s.labels.get("instance") in window.instances}


def config_json(configs: dict[str, LiveConfig]) -> dict[str, Any]:
    """Each instance's configuration as the document shows it: values and where each came from."""
    return {inst: {"values": dict(sorted(c.values.items())), "sources": dict(sorted(c.sources.items()))}
            for inst, c in sorted(configs.items())}


def diagnose_remote(engine: RemoteEngine, start_ms: int, end_ms: int, instance: str | None,
                    pack: list[RuleFile] | list[RuleGroup]) -> dict:
    """The diagnose document for (start_ms, end_ms] from a Prometheus: the JSON contract, `source: prometheus:URL`.

    Adds `config` (per instance: values and their sources, inferred ones said so) and `step_seconds`.
    """
    window, configs, incidents = remote_incidents(engine, start_ms, end_ms, instance, pack)
    incidents = link_episodes(incidents, causal_links(pack))
    rank_fixes(engine, lambda _s, _e: lambda inst: (configs[inst].values, configs[inst].sources) if inst in configs else None,
               incidents, end_ms, pack_objectives(pack))
    counts = _series_counts(engine, window)
    health = summaries(engine, window.instances, start_ms, end_ms, counts, {})
    return {
        "window": {"start": iso_seconds(start_ms), "end": iso_seconds(end_ms)},
        "source": engine.source,
        "instances": window.instances,
        "incidents": incidents,
        "summary": [s.as_dict() for s in health],
        "summary_source": "prometheus",  # answered by its own query engine (a Thanos may read downsampled blocks)
        "config": config_json(configs),
        "step_seconds": window.step_ms / 1000,
    }


def find_remote_incident(engine: RemoteEngine, start_ms: int, end_ms: int, pack: list[RuleFile] | list[RuleGroup],
                         incident_id: str) -> tuple[dict, dict[str, Any], list[dict]]:
    """(the incident, its instance's config entry, every incident of the window) for `report ID --prometheus`.

    Incident ids are stable (rule, labels and start on the step grid), so the evaluation over the
    window `diagnose` used finds the same id again.
    """
    _window, configs, found = remote_incidents(engine, start_ms, end_ms, None, pack)
    hits = [i for i in found if i["id"] == incident_id] or [i for i in found if i["id"].startswith(incident_id)]
    if not hits:
        raise RemoteIncidentNotFound(
            f"no incident {incident_id!r} in what {engine.source} gives between {iso_seconds(start_ms)} and "
            f"{iso_seconds(end_ms)} ({len(found)} incident(s) there); pass the --since/--until (and --selector, "
            "--rules, --params) that diagnose used: its table prints the report command to run.")
    if len({i["id"] for i in hits}) > 1:
        raise RemoteIncidentNotFound(f"{incident_id!r} matches several incidents ({', '.join(i['id'] for i in hits)}); "
                                     "give more of the id.")
    inc = hits[0]
    return inc, config_json(configs).get(inc.get("instance") or "", {}), found
