"""Causal links between incidents, declared as data by the rules' `explains` key.

Like Alertmanager's inhibit_rules (a source alert silences target alerts whose `equal` labels
match), but nothing is silenced: agent/diagnosis/episodes.py marks the target incidents as
explained by the source. The links form a graph over incident ids that must have no cycle, so
every episode has a root; a cycle is refused when the pack is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_sentinel.agent.alerts.rulemodel import RuleFile, RuleFileError, RuleGroup


@dataclass(frozen=True)
class CausalLink:
    """`cause` explains `effect` when the labels in `equal` agree; `where` is the declaring rule."""

    cause: str
    effect: str
    equal: tuple[str, ...] = ()
    where: str = ""


@dataclass
class CausalLinks:
    """What episode grouping needs from a pack: the links, and each alert's `for` (how long an
    incident's condition held before it fired, so its onset can be compared with its cause's)."""

    links: list[CausalLink] = field(default_factory=list)
    pending_ms: Mapping[str, int] = field(default_factory=dict)

    def causes_of(self, effect: str) -> list[CausalLink]:
        """The links whose effect is `effect`."""
        return [link for link in self.links if link.effect == effect]


def _groups(rules: list[RuleFile] | list[RuleGroup]) -> list[RuleGroup]:
    return [g for x in rules for g in (x.groups if isinstance(x, RuleFile) else [x])]


def causal_links(rules: list[RuleFile] | list[RuleGroup]) -> CausalLinks:
    """The pack's links, one per (cause, effect) named in an `explains` item; RuleFileError on a cycle.

    `explains: [{incidents: [queue_blocking], equal: [instance]}]` on the kv_cache_pressure rule
    -> [CausalLink('kv_cache_pressure', 'queue_blocking', ('instance',), 'rules/kv-cache.yaml:16')].
    """
    links: list[CausalLink] = []
    pending: dict[str, int] = {}
    for g in _groups(rules):
        for r in g.rules:
            if not r.is_alert:
                continue
            pending[r.name] = r.for_ms
            for item in r.explains:
                links.extend(CausalLink(r.incident or "", effect, tuple(item.equal), r.where)
                             for effect in item.incidents)
    problems = cycle_problems(links)
    if problems:
        raise RuleFileError(problems)
    return CausalLinks(links, pending)


def cycle_problems(links: list[CausalLink]) -> list[str]:
    """One 'file:line: message' per cycle in the links' graph (a -> b -> a), none when it is acyclic."""
    effects: dict[str, list[CausalLink]] = {}
    for link in links:
        effects.setdefault(link.cause, []).append(link)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    problems: list[str] = []

    def visit(node: str, path: list[CausalLink]) -> None:
        state[node] = 1
        for link in effects.get(node, []):
            if state.get(link.effect) == 1:
                cycle = path[next(i for i, p in enumerate(path + [link]) if p.cause == link.effect):] + [link]
                names = " -> ".join([cycle[0].cause] + [c.effect for c in cycle])
                problems.append(f"{cycle[0].where}: explains makes a cycle: {names}; an incident cannot be "
                                "explained by what it explains: drop one of these links")
            elif state.get(link.effect) is None:
                visit(link.effect, path + [link])
        state[node] = 2

    for cause in sorted(effects):
        if cause not in state:
            visit(cause, [])
    return problems
