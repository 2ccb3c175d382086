"""`episode_test` cases of rule test files: the episodes a window of the input series gives.

Beside promtool's `alert_rule_test` and `promql_expr_test`, a test group may hold

    episode_test:
    - eval_time: 12m          # the window (0, 12m] of the group's input series, as `diagnose` reads it
      tolerance: 1m           # optional: the episode tolerance (default: diagnose's)
      exp_episodes:           # every episode of the window, in any order
      - instance: "a:8000"    # optional
        roots: [kv_cache_pressure]
        caused_by: {queue_blocking: [kv_cache_pressure], ttft_slo_breach: [kv_cache_pressure, queue_blocking]}

Incidents are named by their `incident` label; `caused_by` lists every explained incident. promtool
knows no such key: `rules export` drops these cases. Grouping is agent/diagnosis' job, so the
runner that evaluates a window and links its episodes is passed in (`EpisodeRunner`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_sentinel.agent.alerts.rulemodel import RuleFileError, RuleGroup
from vllm_sentinel.collectors.timefmt import format_prometheus_duration_ms, parse_prometheus_duration_ms

# (store, rule groups, window end ms, step ms, tolerance ms or None) -> incidents with `episode` and `caused_by`
EpisodeRunner = Callable[[Any, list[RuleGroup], int, int, "int | None"], list[dict]]

CASE_KEYS = ("eval_time", "tolerance", "exp_episodes")
EPISODE_KEYS = ("instance", "roots", "caused_by")


class EpisodeCaseError(ValueError):
    """An episode_test case that is malformed (not a failed expectation)."""


def _ms(value: Any, what: str) -> int:
    try:
        return parse_prometheus_duration_ms(str(value))
    except ValueError as e:
        raise EpisodeCaseError(f"episode_test {what}: {e}") from None


def _names(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise EpisodeCaseError(f"episode_test {what} must be a list of incident names, e.g. [kv_cache_pressure]")
    return tuple(sorted(value))


def expected_episode(item: Any) -> dict:
    """One `exp_episodes` item in canonical form: {'instance'?, 'roots': (...), 'caused_by': {name: (...)}}."""
    if not isinstance(item, dict) or set(item) - set(EPISODE_KEYS):
        raise EpisodeCaseError(f"an exp_episodes item is a mapping with keys {', '.join(EPISODE_KEYS)}")
    caused = item.get("caused_by") or {}
    if not isinstance(caused, dict):
        raise EpisodeCaseError("episode_test caused_by must map an incident to the incidents explaining it")
    out = {"roots": _names(item.get("roots") or [], "roots"),
           "caused_by": {str(k): _names(v, f"caused_by of {k}") for k, v in sorted(caused.items())}}
    if item.get("instance") is not None:
        out["instance"] = str(item["instance"])
    return out


def actual_episodes(incidents: list[dict]) -> list[dict]:
    """Linked incidents in the canonical form of `expected_episode`, one per episode."""
    by_id = {i["id"]: i for i in incidents}
    episodes: dict[str, dict] = {}
    for inc in incidents:
        ep = episodes.setdefault(inc["episode"], {"instance": inc.get("instance") or "", "roots": [], "caused_by": {}})
        if not inc["caused_by"]:
            ep["roots"].append(inc["incident"])
        else:
            causes = ep["caused_by"].setdefault(inc["incident"], set())
            causes.update(by_id[c]["incident"] for c in inc["caused_by"])
    return [{"instance": e["instance"], "roots": tuple(sorted(e["roots"])),
             "caused_by": {k: tuple(sorted(v)) for k, v in sorted(e["caused_by"].items())}}
            for e in episodes.values()]


def _matches(expected: list[dict], got: list[dict]) -> bool:
    left = list(got)
    for exp in expected:
        hit = next((g for g in left if {k: v for k, v in g.items() if k in exp} == exp), None)
        if hit is None:
            return False
        left.remove(hit)
    return not left


def _show(episodes: list[dict]) -> str:
    def one(e: dict) -> str:
        where = f"{e['instance']}: " if e.get("instance") else ""
        causes = "".join(f"; {k} <- {', '.join(v)}" for k, v in e["caused_by"].items())
        return f"{where}roots {', '.join(e['roots']) or '-'}{causes}"
    return "[" + " | ".join(one(e) for e in sorted(episodes, key=lambda e: (e.get("instance", ""), e["roots"]))) + "]"


def check_episode_case(case: Any, runner: EpisodeRunner | None, store: Any, groups: list[RuleGroup],
                       eval_interval_ms: int, group_name: str) -> list[str]:
    """The failures of one episode_test case (empty when it holds), in the style of promtool's."""
    if not isinstance(case, dict) or set(case) - set(CASE_KEYS) or "eval_time" not in case:
        raise EpisodeCaseError(f"an episode_test item is a mapping with eval_time and keys {', '.join(CASE_KEYS)}")
    if runner is None:
        raise EpisodeCaseError("episode_test needs vllm-sentinel's episode grouping: run it with "
                               "`vllm-sentinel rules test` (promtool does not know it)")
    t = _ms(case["eval_time"], "eval_time")
    tolerance = _ms(case["tolerance"], "tolerance") if case.get("tolerance") is not None else None
    expected = [expected_episode(e) for e in case.get("exp_episodes") or []]
    try:
        got = actual_episodes(runner(store, groups, t, eval_interval_ms, tolerance))
    except RuleFileError as e:
        return [f"    {p}" for p in e.problems]
    if _matches(expected, got):
        return []
    prefix = f"    name: {group_name},\n" if group_name else ""
    return [f"{prefix}    episodes, time: {format_prometheus_duration_ms(t)}, \n"
            f"        exp: {_show(expected)}\n        got: {_show(got)}"]
