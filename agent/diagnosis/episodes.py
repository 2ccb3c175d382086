"""Episodes: incidents of one instance that happen together, the cause first and its symptoms linked to it.

An incident's span runs from its onset (its start minus its rule's `for`: the condition held
that long before the alert fired) to its end (open while it still fires). Incidents of one
instance whose spans overlap, or come within `tolerance_ms` of each other, form an episode,
chains included (a overlaps b overlaps c). Inside an episode an incident is `caused_by` each
other incident that explains it by the pack's links (agent/alerts/explains.py), with the link's
`equal` labels agreeing and the two spans overlapping (within the tolerance); the episode's
roots are the incidents nothing explains. Nothing is dropped: every incident comes back, ordered
and linked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from vllm_sentinel.agent.alerts.explains import CausalLink, CausalLinks
from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms

# Symptoms read from histograms over 1-2 minute windows, with their own `for`, can fire a while
# after their cause ended (a TTFT breach shows once the stalled requests finish), and Prometheus
# evaluates every 15 s or more: a minute of slack links them without merging unrelated hours.
DEFAULT_TOLERANCE_MS = 60_000
_OPEN = 2**62  # the end of an incident still firing


def _span(inc: Mapping, pending_ms: Mapping[str, int]) -> tuple[int, int]:
    start = parse_rfc3339_ms(inc["start"])
    end = parse_rfc3339_ms(inc["end"]) if inc.get("end") else _OPEN
    return start - pending_ms.get(inc.get("rule") or "", 0), end


def _label(inc: Mapping, name: str) -> str:
    """A label of the incident as its alert had it ('' when absent, as in Prometheus)."""
    if name in ("instance", "incident", "severity"):
        return str(inc.get(name) or "")
    return str((inc.get("labels") or {}).get(name) or "")


def _explains(link: CausalLink, cause: Mapping, effect: Mapping) -> bool:
    return cause.get("incident") == link.cause and all(_label(cause, n) == _label(effect, n) for n in link.equal)


def episode_id(root_ids: list[str]) -> str:
    """A stable id from the episode's root incident ids: later symptoms joining do not change it."""
    return hashlib.sha256("\x00".join(sorted(root_ids)).encode()).hexdigest()[:16]


def _group(incidents: list[dict], spans: dict[str, tuple[int, int]], tolerance_ms: int) -> list[list[dict]]:
    """Incidents of one instance in overlap chains: [[a, b], [c]] when a and b overlap and c comes later."""
    groups: list[list[dict]] = []
    reach = -_OPEN
    for inc in sorted(incidents, key=lambda i: (spans[i["id"]][0], i["start"], i["id"])):
        onset, end = spans[inc["id"]]
        if groups and onset <= reach + tolerance_ms:
            groups[-1].append(inc)
        else:
            groups.append([inc])
        reach = max(reach, end) if len(groups[-1]) > 1 else end
    return groups


def _causes(episode: list[dict], links: CausalLinks, spans: dict[str, tuple[int, int]],
            tolerance_ms: int) -> dict[str, list[str]]:
    """incident id -> the ids in the episode that explain it, by start."""
    out: dict[str, list[str]] = {}
    for effect in episode:
        lo, hi = spans[effect["id"]]
        found = [cause for link in links.causes_of(effect.get("incident") or "") for cause in episode
                 if cause is not effect and _explains(link, cause, effect)
                 and spans[cause["id"]][0] <= hi + tolerance_ms and lo <= spans[cause["id"]][1] + tolerance_ms]
        out[effect["id"]] = list(dict.fromkeys(c["id"] for c in sorted(found, key=lambda c: (c["start"], c["id"]))))
    return out


def _depth(inc_id: str, causes: dict[str, list[str]], seen: frozenset[str] = frozenset()) -> int:
    """How many links below a root an incident sits (a guard stops at a cycle the loader would refuse)."""
    parents = [c for c in causes.get(inc_id, []) if c not in seen]
    return 1 + max((_depth(c, causes, seen | {inc_id}) for c in parents), default=-1)


def link_episodes(incidents: list[dict], links: CausalLinks | None = None,
                  tolerance_ms: int = DEFAULT_TOLERANCE_MS) -> list[dict]:
    """The incidents with `episode` and `caused_by` added, ordered: episodes by onset, roots first in each.

    [queue_blocking 10:01-10:05, kv_cache_pressure 10:00-10:05] with kv_cache_pressure explaining
    queue_blocking -> [kv_cache_pressure (caused_by []), queue_blocking (caused_by [kv id])], one episode.
    """
    links = links or CausalLinks()
    spans = {i["id"]: _span(i, links.pending_ms) for i in incidents}
    by_instance: dict[str, list[dict]] = {}
    for inc in incidents:
        by_instance.setdefault(str(inc.get("instance") or ""), []).append(inc)
    episodes: list[tuple[int, list[dict]]] = []
    for members in by_instance.values():
        for episode in _group(members, spans, tolerance_ms):
            causes = _causes(episode, links, spans, tolerance_ms)
            eid = episode_id([i["id"] for i in episode if not causes[i["id"]]])
            ordered = sorted(episode, key=lambda i: (_depth(i["id"], causes), i["start"], i["rule"], i["id"]))
            episodes.append((min(spans[i["id"]][0] for i in episode),
                             [{**i, "episode": eid, "caused_by": causes[i["id"]]} for i in ordered]))
    episodes.sort(key=lambda e: (e[0], e[1][0]["start"], e[1][0]["id"]))
    return [inc for _onset, members in episodes for inc in members]


def episodes_of(incidents: list[dict]) -> list[list[dict]]:
    """Linked incidents (as `link_episodes` orders them) cut into their episodes, in order."""
    out: list[list[dict]] = []
    for inc in incidents:
        if out and inc.get("episode") is not None and out[-1][0].get("episode") == inc.get("episode"):
            out[-1].append(inc)
        else:
            out.append([inc])
    return out


def explaining(incident: dict, incidents: list[dict]) -> list[tuple[str, str]]:
    """(incident name, id) of each incident in `incidents` that `incident` is caused_by, in its order."""
    names = {i.get("id"): str(i.get("incident") or "?") for i in incidents}
    return [(names.get(c, "?"), c) for c in incident.get("caused_by") or []]
