"""`diagnose`: incidents and a health summary over a window, in the `diagnose --format json` contract."""

from __future__ import annotations

from collections.abc import Callable

from vllm_sentinel.agent.alerts.explains import CausalLinks
from vllm_sentinel.agent.diagnosis.captures import profile_of
from vllm_sentinel.agent.diagnosis.episodes import link_episodes
from vllm_sentinel.agent.diagnosis.fix_ranking import pack_objectives, rank_fixes
from vllm_sentinel.agent.diagnosis.incidents import duration_s, stored_incidents
from vllm_sentinel.agent.diagnosis.summary import health_summary
from vllm_sentinel.agent.diagnosis.whatif import store_configs
from vllm_sentinel.agent.promql.engine import Engine
from vllm_sentinel.agent.store.db import Store
from vllm_sentinel.agent.store.sample_reads import instances_with_samples
from vllm_sentinel.collectors.timefmt import iso_seconds, parse_rfc3339_ms

# rules evaluation over a window, wired in by the caller once rules are loaded:
# (store, start_ms, end_ms, instance) -> incident dicts of the JSON contract
WindowEvaluator = Callable[[Store, int, int, str | None], list[dict]]


class NoDataInWindow(Exception):
    """The store holds no sample in the asked window."""


def diagnose(store: Store, start_ms: int, end_ms: int, instance: str | None = None, source: str = "",
             evaluate_window: WindowEvaluator | None = None, links: CausalLinks | None = None) -> dict:
    """The diagnose document for (start_ms, end_ms]: window, source, instances, incidents, summary.

    Incidents come grouped in episodes (agent/diagnosis/episodes.py) by `links`, by default those
    of the pack behind `evaluate_window` (its `links`, as `pack_window_evaluator` gives it).
    """
    seen = instances_with_samples(store, start_ms, end_ms)
    if instance is not None:
        seen = [i for i in seen if i == instance]
    if not seen:
        span = store.time_range()
        have = f"it holds {iso_seconds(span[0])} .. {iso_seconds(span[1])}" if span else "it is empty"
        wanted = f" for instance {instance}" if instance else ""
        raise NoDataInWindow(f"no samples{wanted} between {iso_seconds(start_ms)} and {iso_seconds(end_ms)} "
                             f"in {store.path}; {have}. Widen --since/--until or check --db.")
    replayed = evaluate_window(store, start_ms, end_ms, instance) if evaluate_window else []
    if links is None:
        links = getattr(evaluate_window, "links", None)
    live = stored_incidents(store, start_ms, end_ms, instance)
    for inc in live:
        inc["found_by"] = "live"  # recorded by the daemon as it evaluated
    for inc in replayed:
        inc["found_by"] = "replay"  # found now, by evaluating the rules over the stored samples
    incidents = link_episodes(merge_incidents(live, replayed), links)
    for inc in incidents:
        profile = profile_of(store, inc["id"])
        if profile:
            inc["profile"] = profile
    rank_fixes(Engine(store), lambda s, e: store_configs(store, s, e), incidents, end_ms,
               pack_objectives(getattr(evaluate_window, "pack", None)))
    doc = {
        "window": {"start": iso_seconds(start_ms), "end": iso_seconds(end_ms)},
        "source": source or f"duckdb:{store.path}",
        "instances": seen,
        "incidents": incidents,
    }
    engine = Engine(store, rollups=True)
    doc["summary"] = [s.as_dict() for s in health_summary(store, start_ms, end_ms, instance, engine, seen)]
    # whether the summary's long windows read five-minute rollups (sum and avg equal to rounding) or only samples
    doc["summary_source"] = "rollups" if engine.rollups_used else "samples"
    plan = getattr(evaluate_window, "plan", None)
    if plan is not None:  # which stretches the daemon's live records answer, and which were replayed
        doc["evaluation"] = plan(store, start_ms, end_ms).as_dict()
    return doc


def merge_incidents(live: list[dict], replayed: list[dict]) -> list[dict]:
    """Incidents the daemon recorded live, plus those the window replay found that it did not.

    Live rows are exact (evaluated every few seconds as data arrived); the replay finds what no
    daemon watched (ingested dumps, other rules). The same rule and labels overlapping in time
    are one incident: the live row wins, ended where the replay shows it ended if the daemon has not
    yet evaluated that far.
    """
    def key(i: dict) -> tuple:
        return i["rule"], i.get("instance"), tuple(sorted((i.get("labels") or {}).items()))

    def span(i: dict) -> tuple[str, str]:
        return i["start"], i.get("end") or "9999"

    merged = [_ended_by_replay(x, [r for r in replayed if key(r) == key(x)]) for x in live]
    out = list(merged)
    for r in replayed:
        if not any(key(r) == key(x) and span(r)[0] < span(x)[1] and span(x)[0] < span(r)[1] for x in merged):
            out.append(r)
    out.sort(key=lambda i: (i["start"], i["rule"], i["id"]))
    return out


def _ended_by_replay(live: dict, same: list[dict]) -> dict:
    """A live incident still open whose samples, replayed, show it ended: resolved at the replay's end.

    The daemon evaluates every few seconds and may not yet have run the evaluation after recovery (on a
    starved host that takes a while), while the replay just read every sample through the window's end.
    It stays open when any overlapping replayed incident is open too (the data shows it firing again).
    """
    if live.get("end") is not None:
        return live
    after = [r for r in same if (r.get("end") or "9999") > live["start"]]
    if not after or any(r.get("end") is None for r in after):
        return live
    end = max(r["end"] for r in after)
    return {**live, "end": end, "state": "resolved",
            "duration_s": duration_s(parse_rfc3339_ms(live["start"]), parse_rfc3339_ms(end))}
