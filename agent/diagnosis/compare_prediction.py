"""compare's prediction: the what-if model calibrated on the before window alone, asked for the after window's
configuration, beside what the after window measured, with the model's error judged as its calibration is.

Nothing of the after window goes into the prediction but its configuration: it is the figure `whatif --set`
would have printed before the change, from the same history. A change the model does not represent (another
model, dtype or parallelism moves the step time the calibration fitted) withholds it, naming the setting;
so do a before window the model cannot calibrate on and traffic that changed between the sides (requests of
other lengths, or an open loop's arrival rate): the model replays the before window's traffic. An after window
whose engine steps ran at another speed than the model's (agent/diagnosis/step_speed.py) shows the prediction
beside its measurement without judging it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from vllm_sentinel.agent.diagnosis.fix_ranking import KNOB_OF_PARAM
from vllm_sentinel.agent.diagnosis.sim_calibrate import (CALIBRATION_BOUND, ERROR_FLOORS, JUDGED,
                                                         Unrepresentable, contended, judge, lost_its_core,
                                                         relative_error)
from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig
from vllm_sentinel.agent.diagnosis.sim_workload import Measured, NotEnoughTraffic, read_workload
from vllm_sentinel.agent.diagnosis.step_speed import step_speed, step_time_of
from vllm_sentinel.agent.diagnosis.vllm_defaults import PLATFORM_CPU
from vllm_sentinel.agent.diagnosis.whatif import WhatIfQuery, whatif
from vllm_sentinel.agent.diagnosis.whatif_knobs import BadKnob

log = logging.getLogger(__name__)

# a configuration name compare lists -> the model's --set knob; the block count vLLM reports is the engine's own
KNOB_OF_SETTING = {**KNOB_OF_PARAM, "num_gpu_blocks": "num-gpu-blocks"}
# memory settings whose whole effect on the model is the block count the after side reports
VIA_BLOCKS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes", "VLLM_CPU_KVCACHE_SPACE",
              "--num-gpu-blocks-override")
# what vLLM derives from the blocks, their size and --max-model-len: follows from the settings the model takes
DERIVED_FIGURES = ("kv_cache_size_tokens", "kv_cache_max_concurrency")
GOODPUT_FLOOR = 0.05  # req/s: a difference under it is no error
# (key in the prediction, key in the after window's reading, label) in the order shown
SHOWN = (("ttft_p95_s", "ttft_p95_s", "TTFT p95 s"), ("itl_p95_s", "itl_p95_s", "inter-token p95 s"),
         ("preemptions_per_s", "preemptions_per_s", "preemptions/s"),
         ("generation_tokens_per_s", "generation_tokens_per_s", "generated tokens/s"),
         ("goodput_rps", "goodput_rps", "goodput req/s"))


def predict_change(engine: Any, instance: str, before: tuple[int, int], after: tuple[int, int],
                   changes: list[dict], config: Mapping[str, Any], goodput_after: float | None,
                   objectives: tuple[float, float], rate_ratio: float | None) -> dict | None:
    """The prediction block of compare's document (see the module's docstring); None when nothing changed.

    `config` is the configuration in force at the end of the before window; `rate_ratio` the after side's request
    rate over the before side's (None: unknown)."""
    if not changes:
        return None
    sets, unmodelled = _sets(changes)
    block: dict[str, Any] = {"basis": "the model calibrated on the before window, asked for the after window's "
                                      "configuration", "changes": [], "bound": CALIBRATION_BOUND,
                             "withheld": None, "rows": [], "within_bound": None, "over": [], "notes": [],
                             "worker_busy": {"before": None, "after": None}, "step_speed": None, "unjudged": None}
    if not sets and not unmodelled:
        block["withheld"] = "no setting the model represents changed"
        return block
    if unmodelled:
        block["withheld"] = f"the model does not represent a change of {', '.join(unmodelled)}: it moves the step " \
                            "time the calibration fitted"
        return block
    try:
        seen = read_workload(engine, instance, after[0], after[1])
        other = _other_load(read_workload(engine, instance, before[0], before[1]).describe(), seen.describe(),
                            rate_ratio)
    except NotEnoughTraffic as e:
        block["withheld"] = f"a window cannot be read as the model reads it: {e}"
        return block
    if other:
        block["withheld"] = f"{other}: the model replays the before window's traffic, so its prediction is not " \
                            "this load's"
        return block
    busy = seen.worker_busy() if (config or {}).get("platform") == PLATFORM_CPU else None
    block["worker_busy"]["after"] = None if busy is None else round(busy, 4)
    if lost_its_core(busy):
        block["withheld"] = f"{contended(busy, 'the after window')}: its measurement cannot judge the prediction"
        return block
    query = WhatIfQuery(before[0], before[1], instance, sets=tuple(sets), ttft_slo_s=objectives[0],
                        tpot_slo_s=objectives[1])
    try:
        doc = whatif(engine, lambda _inst: (config, {}) if config else None, query)
    except (NotEnoughTraffic, Unrepresentable, BadKnob) as e:
        block["withheld"] = str(e)
        return block
    except Exception as e:  # the model's failure must not cost the operator the comparison
        log.warning("compare's prediction failed for %s: %s", instance, e)
        block["withheld"] = f"the model failed: {e}"
        return block
    block["changes"] = doc["scenarios"][1]["changes"] if len(doc["scenarios"]) > 1 else []
    block["calibration_error"] = doc["calibration"]["error"]
    block["worker_busy"]["before"] = doc["calibration"]["worker_busy"]
    if doc["withheld"]:
        block["withheld"] = doc["withheld"]
        return block
    speed = step_speed(step_time_of(doc["calibration"]["step_time"]), seen,
                       EngineConfig(**doc["scenarios"][1]["config"]))
    if speed is not None:
        block["step_speed"] = speed.as_dict()
        if speed.changed:
            block["unjudged"] = speed.reason("the after window")
    _judge(block, doc["scenarios"][1]["predicted"], seen.measured, goodput_after)
    return block


def _other_load(before: dict, after: dict, rate_ratio: float | None) -> str | None:
    """How the after window's traffic differs from the before window's beyond the bound, None where it does not.
    A closed loop's rate follows the server's speed, which is what is predicted; an open loop's is the traffic's."""
    for key, what in (("prompt_tokens_mean", "prompts"), ("output_tokens_mean", "outputs")):
        b, a = before.get(key), after.get(key)
        if b and a is not None and abs(a / b - 1) > CALIBRATION_BOUND:
            return f"the {what} changed from {b:g} to {a:g} tokens on average between the windows"
    if before.get("mode") == "open loop" and rate_ratio is not None and abs(rate_ratio - 1) > CALIBRATION_BOUND:
        return f"the requests arriving changed by {rate_ratio - 1:+.0%} between the windows"
    return None


def _sets(changes: list[dict]) -> tuple[list[tuple[str, str]], list[str]]:
    """The model's --set pairs for the configuration changes, and the changed settings it cannot represent."""
    params = {c["param"] for c in changes}
    sets, unmodelled = [], []
    for c in changes:
        knob = KNOB_OF_SETTING.get(c["param"])
        if c["param"] in DERIVED_FIGURES:
            continue
        if c["param"] in VIA_BLOCKS and "num_gpu_blocks" in params:
            continue  # the engine's block count, set below from its own report, is this setting's effect
        if knob is None or c.get("after") is None:
            unmodelled.append(c["param"])
        else:
            sets.append((knob, str(c["after"])))
    # the reported block count last: where an override and the engine's count disagree, the engine's holds
    sets.sort(key=lambda s: s[0] == "num-gpu-blocks")
    return sets, unmodelled


def _judge(block: dict, predicted: dict, seen: Measured, goodput_after: float | None) -> None:
    """Fill the rows (predicted, measured, error) and the verdict on the bound, as the calibration judges; an
    unjudged block keeps its rows and gives no verdict."""
    measured = {**seen.as_dict(), "goodput_rps": goodput_after}
    floors = {**ERROR_FLOORS, "goodput_rps": GOODPUT_FLOOR}
    error = {key: relative_error(predicted.get(key), measured.get(name), floors[key]) for key, name, _l in SHOWN}
    over, notes = judge({k: error[k] for k in JUDGED}, predicted, seen)
    block["rows"] = [{"signal": label, "key": key, "predicted": predicted.get(key), "measured": measured.get(name),
                      "error": None if error[key] is None else round(error[key], 4)} for key, name, label in SHOWN]
    if block["unjudged"]:
        return
    block["over"] = [k for k, _e in over]
    block["within_bound"] = not over
    block["notes"] += notes
