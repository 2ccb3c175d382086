"""`compare`: did a change help? Signals before and after it, each tested against the noise, and a verdict.

The two sides are two windows of one instance (around the latest configuration change or restart,
agent/diagnosis/compare_windows.py, or given), or one window of two instances (`--versus`, a
canary). Each signal (agent/diagnosis/compare_signals.py) is read over each whole window (the
before/after values) and per interval (a twelfth of the window, 10 s at least); the per-interval
values of the two sides go through a Mann-Whitney U test (agent/diagnosis/significance.py). Where the request rates of the
two sides differ by more than LOAD_TOLERANCE, counts that grow with load (preemptions) are tested
per finished request instead of per second, so a quieter after-window cannot pass for a fix.
Latency quantiles are per request already and are not rescaled.

An incident counts for the after side when it started in the after window or was still firing at its
end. One that began before the after window and resolved inside it is the before side's, carried
over: a rule's window (preemptions over 2 m) still reads the samples from before the change for a
while, and a replay finds such a condition true from the after window's first evaluation.

Each side is also judged against latency objectives (agent/diagnosis/compare_slo.py): SLO
attainment, the share of requests under the TTFT and TPOT objectives, and goodput, the requests
per second that met them, both tested per interval like the other signals. The verdict is one
procedure: goodput that changed significantly decides it (improved or regressed), and the
headline signals (p95 latencies, throughput, preemptions) that moved the other way are named as
its cost. Where goodput is flat (or zero on both sides: every request missed, or unreadable) the
significant headline signals decide: better and worse together are a trade-off, named as what
was bought with what; only better is improved, only worse regressed, none no clear change.
Incidents that stopped or started are listed but never turn a verdict: an incident that stopped
while goodput fell is no improvement, and one can miss a short window (its `for`, a live
evaluation stretched on a busy host).

Where the configuration changed, the what-if model calibrated on the before window alone predicts
the after window's configuration and sits beside what was measured (agent/diagnosis/compare_prediction.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.diagnosis.compare_signals import (NEUTRAL, REQUEST_RATE, SIGNALS, SLO_SIGNALS, Signal,
                                                          WindowValues, present, window_values)
from vllm_sentinel.agent.diagnosis.compare_prediction import predict_change
from vllm_sentinel.agent.diagnosis.compare_slo import ATTAINMENT, GOODPUT, Objectives, slo_block
from vllm_sentinel.agent.diagnosis.compare_windows import ChangeWindows, NoChangeFound, auto_windows
from vllm_sentinel.agent.diagnosis.diagnose import NoDataInWindow
from vllm_sentinel.agent.diagnosis.liveconfig import ARGV_FLAGS
from vllm_sentinel.agent.diagnosis.significance import ALPHA, MIN_INTERVALS, compare_intervals
from vllm_sentinel.collectors.timefmt import iso_seconds, parse_rfc3339_ms

LOAD_TOLERANCE = 0.10  # request rates within 10 %: the same traffic, nothing rescaled
MIN_EFFECT_PCT = 5.0  # a significant change is also at least this large
DEFAULT_SETTLE_MS = 60_000
# intervals: about INTERVALS_A_SIDE per window, never under MIN_INTERVAL_MS (a rate needs a few scrapes)
INTERVALS_A_SIDE = 12
MIN_INTERVAL_MS = 10_000
# configuration values derived from others or describing the snapshot, not settings an operator changes
DERIVED = {"kv_capacity_tokens", "kv_bytes_per_token", "platform", "is_mla"}

__all__ = ["CompareRequest", "CompareSource", "NoChangeFound", "NoDataInWindow", "CompareError", "compare"]


class CompareError(Exception):
    """The request cannot be answered as asked (which instance, which windows); the message says how."""


@dataclass
class CompareSource:
    """Where compare reads from: a PromQL engine, and the store's (or a Prometheus') other views."""

    engine: Any
    name: str
    instances: Callable[[int, int], list[str]]  # instances with data in (start, end]
    config_at: Callable[[str, int], dict[str, Any]]  # an instance's configuration values in force at t
    config_changes: Callable[[str, int, int], list[int]]  # times its configuration changed in (start, end]
    incidents: Callable[[int, int, str], list[dict]]  # incidents over (start, end] (diagnose's machinery)


@dataclass
class CompareRequest:
    """What to compare: the searched stretch, the instance(s), given windows or none (the latest change)."""

    stretch: tuple[int, int]
    instance: str | None = None
    versus: str | None = None
    before: tuple[int, int] | None = None
    after: tuple[int, int] | None = None
    settle_ms: int = DEFAULT_SETTLE_MS
    interval_ms: int | None = None  # None: the window's length / INTERVALS_A_SIDE, in whole 5 s
    window_ms: int | None = None
    ttft_slo_s: float = 2.0  # the objectives attainment and goodput are judged by
    tpot_slo_s: float = 0.1
    slo_source: str = "defaults"  # where the objectives came from, in words


def compare(source: CompareSource, req: CompareRequest) -> dict:
    """The compare document: windows, config changes, SLO block, signals with significance, incidents, verdict."""
    if not (req.ttft_slo_s > 0 and req.tpot_slo_s > 0):
        raise CompareError(f"objectives TTFT {req.ttft_slo_s:g} s, TPOT {req.tpot_slo_s:g} s: both must be above "
                           "zero, e.g. --ttft-p95 2s --tpot-p95 100ms")
    objectives = Objectives(req.ttft_slo_s, req.tpot_slo_s)
    instance = _instance(source, req)
    windows = _windows(source, req, instance)
    other = req.versus or instance
    interval = req.interval_ms or interval_for(windows.before[1] - windows.before[0])
    before = window_values(source.engine, instance, *windows.before, interval, objectives)
    after = window_values(source.engine, other, *windows.after, interval, objectives)
    for side, values, inst, (lo, hi) in (("before", before, instance, windows.before),
                                         ("after", after, other, windows.after)):
        if not present(values):
            raise NoDataInWindow(f"no vLLM samples of {inst} in the {side} window {iso_seconds(lo)} .. "
                                 f"{iso_seconds(hi)} in {source.name}; check --instance and the windows")
    load = _load(before, after)
    signals = [s for s in (_signal(sig, before, after, load, interval) for sig in SLO_SIGNALS + SIGNALS)
               if s is not None]
    changes = config_diff(source.config_at(instance, windows.before[1] - 1), source.config_at(other, windows.after[1]),
                          windows.change_ms)
    incidents = incident_changes(source.incidents(*windows.before, instance), source.incidents(*windows.after, other),
                                 windows.after)
    verdict, reasons = decide(signals, incidents)
    prediction = None
    if other == instance:
        prediction = predict_change(source.engine, instance, windows.before, windows.after, changes,
                                    source.config_at(instance, windows.before[1] - 1), after.whole[GOODPUT],
                                    (req.ttft_slo_s, req.tpot_slo_s), load["ratio"])
    return {
        "window": windows.as_dict(),
        "source": source.name,
        "instances": [instance] if other == instance else [instance, other],
        "config_changes": changes,
        "load": load,
        "interval_seconds": interval / 1000,
        "slo": slo_block(objectives, req.slo_source, (before.slo, after.slo),
                         (before.whole[ATTAINMENT], after.whole[ATTAINMENT]),
                         (before.whole[GOODPUT], after.whole[GOODPUT])),
        "signals": [{k: v for k, v in s.items() if not k.startswith("_")} for s in signals],
        "incidents": incidents,
        "verdict": verdict,
        "verdict_reasons": reasons,
        "prediction": prediction,
        "intervals": {s["name"]: {"before": before.intervals[s["name"]], "after": after.intervals[s["name"]]}
                      for s in signals},
    }


def _instance(source: CompareSource, req: CompareRequest) -> str:
    """The instance asked for, or the only one with data in the stretch."""
    if req.instance:
        return req.instance
    if req.versus:
        raise CompareError("--versus B compares B with --instance A: give --instance too")
    given = [w for w in (req.before, req.after) if w]
    span = (min(w[0] for w in given), max(w[1] for w in given)) if given else req.stretch
    seen = source.instances(*span)
    if len(seen) == 1:
        return seen[0]
    if not seen:
        raise NoDataInWindow(f"no vLLM samples between {iso_seconds(span[0])} and {iso_seconds(span[1])} in "
                             f"{source.name}; widen --since/--until (or the windows) or check --db")
    raise CompareError(f"{len(seen)} instances have data ({', '.join(seen[:6])}{' ...' if len(seen) > 6 else ''}); "
                       "pick one with --instance")


def _windows(source: CompareSource, req: CompareRequest, instance: str) -> ChangeWindows:
    if req.versus:
        window = req.after or req.before or req.stretch
        return ChangeWindows(window, window, kind="same window")
    if req.before and req.after:
        return ChangeWindows(req.before, req.after)
    if req.before or req.after:
        raise CompareError("--before and --after go together (or neither: the latest change is found)")
    return auto_windows(source.engine, instance, req.stretch, req.settle_ms, req.window_ms,
                        req.interval_ms or MIN_INTERVAL_MS, source.config_changes)


def interval_for(window_ms: int) -> int:
    """The interval the significance test compares: 600 s -> 50 s, 100 s -> 10 s (MIN_INTERVAL_MS at least)."""
    return max(MIN_INTERVAL_MS, window_ms // INTERVALS_A_SIDE // 5000 * 5000)


def _load(before: WindowValues, after: WindowValues) -> dict:
    """The request rates of both sides, and whether they differ enough to compare counts per request."""
    b, a = before.whole.get(REQUEST_RATE), after.whole.get(REQUEST_RATE)
    ratio = a / b if a is not None and b else None
    return {"request_rate_before": _round(b), "request_rate_after": _round(a), "ratio": _round(ratio),
            "per_request": ratio is not None and abs(ratio - 1) > LOAD_TOLERANCE}


def _per_request(points: list[tuple[int, float | None]], rate: float | None) -> list[float | None]:
    """Each interval's value divided by its side's request rate over the whole window.

    Not by the interval's own rate: where scrapes come 10-20 s apart (a server too busy to answer
    in time) an interval holds every request finished since the last scrape or none, and dividing
    by none would drop the interval: a fix that slows serving would lose the very intervals that
    show it preempting less.
    """
    return [v / rate if v is not None and rate else None for _t, v in points]


def _signal(sig: Signal, before: WindowValues, after: WindowValues, load: dict, interval_ms: int) -> dict | None:
    """One row of `signals`, or None when the signal has no data on either side."""
    b, a = before.whole[sig.name], after.whole[sig.name]
    xs, ys = [v for _, v in before.intervals[sig.name]], [v for _, v in after.intervals[sig.name]]
    if b is None and a is None and not any(v is not None for v in xs + ys):
        return None
    per_request = sig.per_request and load["per_request"]
    if per_request:
        xs = _per_request(before.intervals[sig.name], before.whole.get(REQUEST_RATE))
        ys = _per_request(after.intervals[sig.name], after.whole.get(REQUEST_RATE))
    test = compare_intervals(xs, ys)
    delta = _delta_pct(b, a)
    # a histogram quantile moves within its bucket with every interval: a few per cent is no change
    # anyone acts on, however consistent
    significant = test.significant and (delta is None or abs(delta) >= MIN_EFFECT_PCT)
    better = None if sig.direction == NEUTRAL or a is None or b is None or a == b else (a > b) == (sig.direction > 0)
    seconds = interval_ms // 1000
    if test.p_value is None:
        method = (f"not tested: {test.n_before} and {test.n_after} {seconds} s intervals with data, "
                  f"{MIN_INTERVALS} a side needed")
    else:
        method = (f"Mann-Whitney U over {seconds} s intervals ({test.n_before} vs {test.n_after}), two-sided "
                  f"p={test.p_value:.2g}, alpha {ALPHA}, change of {MIN_EFFECT_PCT:g}% or more")
    if per_request:
        method += f"; per finished request (request rate x{load['ratio']:.2f})"
    return {"name": sig.name, "unit": sig.unit, "before": _round(b), "after": _round(a), "delta_pct": delta,
            "significant": significant, "better": better, "method": method, "p_value": _round(test.p_value),
            "_headline": sig.headline}


def _delta_pct(before: float | None, after: float | None) -> float | None:
    """(after - before) / before in per cent; 0 when both are 0, None when it has no finite value."""
    if before is None or after is None:
        return None
    if before == 0:
        return 0.0 if after == 0 else None
    return round((after - before) / abs(before) * 100, 2)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def config_diff(before: dict[str, Any], after: dict[str, Any], at_ms: int | None) -> list[dict]:
    """The settings that differ: [{param: '--max-num-seqs', before: '4', after: '3', at}], flags by their flag.

    A side with no recorded configuration (a dump, an instance the sidecar never watched) differs in nothing
    known: [] rather than every setting against None.
    """
    if not before or not after:
        return []
    flags = {name: flag for flag, (name, _typ) in ARGV_FLAGS.items()}
    out = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new or name in DERIVED:
            continue
        out.append({"param": flags.get(name, name), "before": None if old is None else str(old),
                    "after": None if new is None else str(new), "at": iso_seconds(at_ms) if at_ms else None})
    return out


def incident_changes(before: list[dict], after: list[dict], after_window: tuple[int, int] | None = None) -> dict:
    """Which incident kinds stopped (before, not after) and started (after, not before); with the after
    window, those that began before it and resolved inside it are carried over, not the after side's."""
    carried = [i for i in after if after_window is not None and carried_over(i, *after_window)]
    b = {i["incident"] for i in before}
    a = {i["incident"] for i in after if i not in carried}
    doc = {"stopped": sorted(b - a), "started": sorted(a - b), "before": sorted(b), "after": sorted(a)}
    doc["carried_over"] = sorted({i["incident"] for i in carried} - a)
    return doc


def carried_over(inc: dict, start_ms: int, end_ms: int) -> bool:
    """The incident began at or before `start_ms` and resolved before `end_ms`."""
    return (parse_rfc3339_ms(inc["start"]) <= start_ms and bool(inc.get("end"))
            and parse_rfc3339_ms(inc["end"]) < end_ms)


def decide(signals: list[dict], incidents: dict) -> tuple[str, list[str]]:
    """improved / regressed / trade-off / no clear change, and its reasons: goodput first, then the headline signals.

    Every significant headline signal also has a reason of its own, "<name> <change> (better)" or
    "(worse)", whatever decided; then the incidents that stopped or started, which decide nothing.
    """
    by_name = {s["name"]: s for s in signals}
    better = [s for s in signals if s["_headline"] and s["significant"] and s["better"] is True]
    worse = [s for s in signals if s["_headline"] and s["significant"] and s["better"] is False]
    itemised = [f"{s['name']} {_change_text(s)} (better)" for s in better]
    itemised += [f"{s['name']} {_change_text(s)} (worse)" for s in worse]
    itemised += [f"incident {n} stopped" for n in incidents["stopped"]]
    itemised += [f"incident {n} started" for n in incidents["started"]]
    good, share = by_name.get(GOODPUT), by_name.get(ATTAINMENT)
    if good is not None and good["significant"] and good["better"] is not None:
        verdict = "improved" if good["better"] else "regressed"
        other_way = worse if good["better"] else better
        lead = _slo_text(good, share)
        if other_way:
            lead += f", {'at the cost of' if good['better'] else 'despite'} {_changes(other_way)}"
        return verdict, [lead] + itemised
    reasons = [_flat_goodput_text(good, share)]
    if better and worse:
        return "trade-off", reasons + [f"{_changes(better)} bought with {_changes(worse)}"] + itemised
    if better or worse:
        return ("improved" if better else "regressed"), reasons + itemised
    return "no clear change", reasons + ["no headline signal changed beyond the noise"] + itemised


def _changes(rows: list[dict]) -> str:
    """'ttft_p95_seconds +98%, queue_time_p95_seconds +51%'."""
    return ", ".join(f"{s['name']} {_change_text(s)}" for s in rows)


def _share_text(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.3g}%"


def _rate_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _slo_text(good: dict, share: dict | None) -> str:
    """'goodput_rps 0.5 -> 1.4 /s (+180%), SLO attainment 41% -> 97%'."""
    text = f"goodput_rps {_rate_text(good['before'])} -> {_rate_text(good['after'])} /s"
    if good["delta_pct"] is not None:
        text += f" ({good['delta_pct']:+.0f}%)"
    if share is not None:
        text += f", SLO attainment {_share_text(share['before'])} -> {_share_text(share['after'])}"
    return text


def _flat_goodput_text(good: dict | None, share: dict | None) -> str:
    """Why goodput did not decide: unknown, zero on both sides, or not changed beyond the noise."""
    if good is None or (good["before"] is None and good["after"] is None):
        return "goodput unknown (no TTFT or TPOT histogram to read SLO attainment from): the headline signals decide"
    if good["before"] == 0 and good["after"] == 0:
        return "goodput_rps 0 on both sides (no request met the SLO): the headline signals decide"
    return f"{_slo_text(good, share)}: goodput not changed beyond the noise, the headline signals decide"


def _change_text(s: dict) -> str:
    if s["delta_pct"] is not None:
        return f"{s['delta_pct']:+.0f}%"
    return f"{s['before'] or 0:.4g} -> {s['after'] or 0:.4g}"
