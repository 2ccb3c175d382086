"""The opening that fixes of one knob share: its current value and the evidence they need, or what is missing."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from vllm_sentinel.agent.diagnosis.fix_inputs import cannot_compute, signals
from vllm_sentinel.agent.diagnosis.fix_registry import Fix, FixFn
from vllm_sentinel.agent.diagnosis.liveconfig import LiveConfig

# fn(cfg, evidence, param, current, *values): the fix once every input is known
KnobFixFn = Callable[..., "Fix | None"]


def knob_fix(key: str, what: str, *needs: str) -> Callable[[KnobFixFn], FixFn]:
    """A fix of the knob `key` that runs only once the knob's value and the evidence signals `needs` are known.

    Without them it returns the Fix that names what is missing (it cannot compute `what`); with them it
    calls fn(cfg, evidence, param, current, *values), param being the flag: "max_num_seqs" -> "--max-num-seqs".
    """
    param = "--" + key.replace("_", "-")

    def deco(fn: KnobFixFn) -> FixFn:
        @functools.wraps(fn)
        def with_inputs(cfg: LiveConfig, evidence: Mapping[str, float | None]) -> Fix | None:
            current = cfg.get(key)
            values, absent = signals(evidence, *needs)
            if current is None or absent:
                return cannot_compute(param, current, cfg, [key], what, absent)
            return fn(cfg, evidence, param, current, *values)
        return with_inputs
    return deco
