"""Every incident's fixes predicted by the what-if model and ranked by goodput under the objectives.

For an incident whose fixes the model can represent (an engine flag it knows, or replicas), the
incident's own stretch of history (its last RANK_WINDOW_MS, at least MIN_WINDOW_MS) is replayed as it
ran and under each fix. A fix then carries its predicted p95s, preemptions, throughput and goodput,
and a `trade` where it buys one headline signal with another (fewer preemptions for a longer TTFT);
fixes are ordered by predicted goodput (then throughput), those the model cannot represent after
them in the rule's order. The incident's `model` block carries the calibration error; where the
replay of the stretch misses the measurement beyond the bound, nothing is predicted or reordered
and `withheld` says why.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.diagnosis.change_points import find_changes
from vllm_sentinel.agent.diagnosis.sim_calibrate import Unrepresentable
from vllm_sentinel.agent.diagnosis.sim_workload import NotEnoughTraffic
from vllm_sentinel.agent.diagnosis.whatif import ConfigLookup, WhatIfQuery, whatif
from vllm_sentinel.agent.diagnosis.whatif_knobs import BadKnob
from vllm_sentinel.collectors.timefmt import parse_rfc3339_ms

log = logging.getLogger(__name__)

RANK_WINDOW_MS = 15 * 60_000
MIN_WINDOW_MS = 60_000
TRADE_MARGIN = 0.10  # a predicted change under 10 % is no change: neither bought nor paid
# fix param -> the model's --set knob
KNOB_OF_PARAM = {"--max-num-seqs": "max-num-seqs", "--max-num-batched-tokens": "max-num-batched-tokens",
                 "--num-gpu-blocks-override": "num-gpu-blocks", "VLLM_CPU_KVCACHE_SPACE": "VLLM_CPU_KVCACHE_SPACE",
                 "--kv-cache-memory-bytes": "kv-cache-memory-bytes", "--kv-cache-dtype": "kv-cache-dtype",
                 "--block-size": "block-size", "--max-model-len": "max-model-len",
                 "--long-prefill-token-threshold": "long-prefill-token-threshold",
                 "--scheduling-policy": "scheduling-policy", "--enable-chunked-prefill": "enable-chunked-prefill"}
# (start_ms, end_ms) -> the configurations in force at end_ms
ConfigsFor = Callable[[int, int], ConfigLookup]
# (prediction key, name in a trade, lower is better)
HEADLINE = (("ttft_p95_s", "TTFT p95", True), ("itl_p95_s", "inter-token p95", True),
            ("preemptions_per_s", "preemptions/s", True), ("generation_tokens_per_s", "tokens/s", False))


@dataclass(frozen=True)
class Objectives:
    """The latency objectives goodput counts against."""

    ttft_p95_s: float = 2.0
    tpot_p95_s: float = 0.1


def pack_objectives(pack: Any) -> Objectives:
    """The objectives a rule pack's parameters set (ttft_slo_seconds, tpot_slo_seconds), else the defaults."""
    values = {k: v for f in pack or [] for k, v in getattr(f, "params", {}).items()}
    default = Objectives()
    return Objectives(float(values.get("ttft_slo_seconds", default.ttft_p95_s)),
                      float(values.get("tpot_slo_seconds", default.tpot_p95_s)))


def scenario_of(fix: dict) -> tuple[tuple[tuple[str, str], ...], int] | None:
    """The model's (--set pairs, replicas) for a fix, None where the model cannot represent it."""
    suggested = fix.get("suggested")
    if suggested is None:
        return None
    if fix.get("param") == "replicas":
        return ((), int(suggested)) if str(suggested).isdigit() and int(suggested) >= 1 else None
    knob = KNOB_OF_PARAM.get(str(fix.get("param")))
    return (((knob, str(suggested)),), 1) if knob else None


def rank_fixes(engine: Any, configs_for: ConfigsFor, incidents: list[dict], window_end_ms: int,
               objectives: Objectives = Objectives()) -> None:
    """Predict and order each incident's fixes in place (see the module's docstring). `configs_for(start, end)`
    gives the configurations in force at the end of a stretch: each incident's own, cut at a restart."""
    for inc in incidents:
        if not _candidates(inc) or not inc.get("instance"):
            continue
        start, end = _stretch(inc, window_end_ms)
        try:
            start, end = one_configuration(engine, inc["instance"], start, end)
        except Exception as e:  # a model failure must not cost the operator the diagnosis
            log.warning("what-if model failed for incident %s: %s", inc.get("id"), e)
            inc["model"] = {"calibration_error": None, "withheld": f"the model failed: {e}"}
            continue
        predict_fixes(engine, configs_for(start, end), inc, start, end, objectives)


def predict_fixes(engine: Any, configs: ConfigLookup, inc: dict, start: int, end: int,
                  objectives: Objectives = Objectives()) -> None:
    """Predict and order one incident's fixes in place from exactly (start, end] of its instance's history."""
    candidates = _candidates(inc)
    if not candidates:
        return
    try:
        inc["model"] = _predict(engine, configs, inc, candidates, start, end, objectives)
    except (NotEnoughTraffic, Unrepresentable, BadKnob) as e:
        inc["model"] = {"calibration_error": None, "withheld": str(e)}
    except Exception as e:  # a model failure must not cost the operator the diagnosis
        log.warning("what-if model failed for incident %s: %s", inc.get("id"), e)
        inc["model"] = {"calibration_error": None, "withheld": f"the model failed: {e}"}


def _candidates(inc: dict) -> list[tuple[int, Any]]:
    """(index, the model's scenario) of each of the incident's fixes the model can represent."""
    found = [(i, scenario_of(f)) for i, f in enumerate(inc.get("fixes") or [])]
    return [(i, s) for i, s in found if s is not None]


def _stretch(inc: dict, window_end_ms: int) -> tuple[int, int]:
    """The incident's last RANK_WINDOW_MS (its end, or the window's while it fires), at least MIN_WINDOW_MS."""
    end = parse_rfc3339_ms(inc["end"]) if inc.get("end") else window_end_ms
    start = max(parse_rfc3339_ms(inc["start"]), end - RANK_WINDOW_MS)
    return min(start, end - MIN_WINDOW_MS), end


def one_configuration(engine: Any, instance: str, start: int, end: int) -> tuple[int, int]:
    """The stretch cut before the first restart or configuration change inside it: the incident's fixes are for
    the configuration it fired under, and a replay across a restart mixes two servers (the demo's kv incident,
    open across its fix's restart, was withheld: 100 % off on preemptions). Still MIN_WINDOW_MS long, reaching back."""
    inside = [c for c in find_changes(engine, instance, start, end) if start < c.at_ms < end]
    if not inside:
        return start, end
    # a restart's gap begins at the old server's last sample (its configuration change is seen where samples resume)
    cut = min(c.gap[0] if c.gap is not None else c.at_ms for c in inside)
    return min(start, cut - MIN_WINDOW_MS), cut


def _predict(engine: Any, configs: ConfigLookup, inc: dict, candidates: list[tuple[int, Any]], start: int, end: int,
             objectives: Objectives) -> dict:
    """The model block; each candidate fix gains `predicted` (and `rank`), and the fixes are reordered."""
    fixes = inc["fixes"]
    doc = whatif(engine, configs, WhatIfQuery(start, end, inc["instance"], ttft_slo_s=objectives.ttft_p95_s,
                                              tpot_slo_s=objectives.tpot_p95_s),
                 candidates=[(f"fix {i}", sets, replicas) for i, (sets, replicas) in candidates])
    cal = doc["calibration"]
    model = {"calibration_error": cal["error"], "withheld": doc["withheld"], "window": doc["window"],
             "step_time": cal["step_time"], "worker_busy": cal["worker_busy"]}
    if doc["withheld"]:
        return model
    baseline = doc["scenarios"][0]["predicted"]
    model["as_configured"] = _brief(baseline)
    for (i, _s), scenario in zip(candidates, doc["scenarios"][1:]):
        predicted = _brief(scenario["predicted"])
        predicted["trade"] = trade(baseline, scenario["predicted"])
        fixes[i]["predicted"] = predicted
    order = sorted((i for i, _s in candidates), key=lambda i: (-(fixes[i]["predicted"]["goodput_rps"] or 0.0),
                                                               -(fixes[i]["predicted"]["throughput_tps"] or 0.0), i))
    ranked = [fixes[i] for i in order] + [f for j, f in enumerate(fixes) if j not in set(order)]
    for rank, f in enumerate(ranked[:len(order)], start=1):
        f["rank"] = rank
    inc["fixes"] = ranked
    return model


def _brief(p: dict) -> dict:
    """A prediction in the fix's terms (DESIGN's JSON contract): p95s, goodput, throughput, preemptions."""
    return {"ttft_p95_s": p["ttft_p95_s"], "tpot_p95_s": p["itl_p95_s"], "goodput_rps": p["goodput_rps"],
            "throughput_tps": p["generation_tokens_per_s"], "preemptions_per_s": p["preemptions_per_s"],
            "slo_attainment": p["slo_attainment"]}


def trade(before: dict, after: dict) -> str | None:
    """'preemptions/s 2.6 → 0 bought with TTFT p95 4.7 → 73' where a fix buys one headline signal with another.

    Where the request rates differ (more replicas serve more of a closed loop), preemptions are compared
    per request, as `compare` does: five replicas preempting as often per request are not five times worse."""
    better, worse = [], []
    rates = before.get("requests_per_s"), after.get("requests_per_s")
    per_request = bool(rates[0] and rates[1]) and abs(_relative(rates[0], rates[1]) or 0.0) >= TRADE_MARGIN
    for key, name, lower in HEADLINE:
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            continue
        if key == "preemptions_per_s" and per_request:
            b, a, name = b / rates[0], a / rates[1], "preemptions per request"  # type: ignore[operator]
        change = _relative(b, a)
        if change is None or abs(change) < TRADE_MARGIN:
            continue
        (better if (change < 0) == lower else worse).append(f"{name} {_fmt(b)} → {_fmt(a)}")
    return f"{', '.join(better)} bought with {', '.join(worse)}" if better and worse else None


def _relative(before: float, after: float) -> float | None:
    if before == 0:
        return None if after == 0 else math.copysign(1.0, after)
    return (after - before) / abs(before)


def _fmt(v: float) -> str:
    return f"{v:.3g}"

