"""Whether a later window's engine steps ran at the speed the model fitted on an earlier one: the host's speed.

A prediction replays the before window's traffic with the before window's step time. If the after window's
steps took another time for the same work (its mean step against what the before window's step time gives for
the after window's tokens per step, recomputed ones counted), the host ran at another speed, or the change
altered what a step costs in a way the model does not represent; the measurement cannot tell which. Seen on a
shared 2-core CI host: the same load on the same configuration stepped at 2.6 ms and at 4.0 ms a step in windows
minutes apart, the busy-waiting worker holding its core in both (a neighbour on the physical core leaves no trace
in the guest's CPU accounting). Past SPEED_BOUND such a window does not judge the prediction; the model's replay of
the after window at its own step time says whether the rest of the model (scheduling, KV blocks, preemption) held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_sentinel.agent.diagnosis.sim_calibrate import Unrepresentable, calibrate
from vllm_sentinel.agent.diagnosis.sim_scheduler import EngineConfig, StepTime
from vllm_sentinel.agent.diagnosis.sim_workload import Workload

# a step this much faster or slower than the model's alone moves throughput about as much: most of the model's
# 30 % bound, before any of the change's own effect is counted
SPEED_BOUND = 0.20


@dataclass(frozen=True)
class StepSpeed:
    """The after window's mean step against the before window's step time for the same tokens a step."""

    measured_s: float
    modelled_s: float
    tokens_per_step: float
    replay_error: dict[str, float | None]  # the model's replay of the after window at its own step time

    @property
    def ratio(self) -> float:
        """Measured over modelled: under 1 the steps ran faster than the model's, over 1 slower."""
        return self.measured_s / self.modelled_s

    @property
    def changed(self) -> bool:
        """Whether the steps' speed moved past SPEED_BOUND."""
        return abs(self.ratio - 1) > SPEED_BOUND

    def reason(self, window: str) -> str:
        """Why a measurement of `window` cannot judge a prediction made at the before window's speed."""
        how = "faster" if self.ratio < 1 else "slower"
        return (f"{window}'s engine steps took {self.measured_s * 1000:.2f} ms for {self.tokens_per_step:.1f} tokens "
                f"a step, where the model fitted on the before window gives {self.modelled_s * 1000:.2f} ms: "
                f"{abs(self.ratio - 1):.0%} {how}, past the {SPEED_BOUND:.0%} bound. The host ran at another speed "
                "(a neighbour on a shared core, another CPU) or the change altered a step's cost in a way the model "
                "does not represent; the measurement cannot tell which, so it does not judge the prediction")

    def as_dict(self) -> dict[str, Any]:
        """The step_speed block: seconds a step measured and modelled, their ratio, whether it moved past the bound,
        and the replay of the after window at its own step time."""
        return {"measured_s": round(self.measured_s, 6), "modelled_s": round(self.modelled_s, 6),
                "tokens_per_step": round(self.tokens_per_step, 3), "ratio": round(self.ratio, 4),
                "bound": SPEED_BOUND, "changed": self.changed,
                "replay_error": {k: None if v is None else round(v, 4) for k, v in self.replay_error.items()}}


def step_speed(before: StepTime, after: Workload, config: EngineConfig) -> StepSpeed | None:
    """The after window's step speed against the before window's step time (see the module's docstring); None where
    the after window cannot be calibrated with `config` (the configuration it ran)."""
    try:
        own = calibrate(after, config)
    except Unrepresentable:
        return None
    if own.mean_step_s is None or own.tokens_per_step is None:
        return None
    modelled = before.base_s + before.per_prefill_token_s * own.tokens_per_step
    return StepSpeed(own.mean_step_s, modelled, own.tokens_per_step, dict(own.error))


def step_time_of(block: dict[str, Any]) -> StepTime:
    """The StepTime of a calibration block's step_time (base_s, per_token_s), as whatif and diagnose print it."""
    return StepTime(block["base_s"], block["per_token_s"], block["per_token_s"])
