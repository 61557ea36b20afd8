"""The δ in force for a δ-rule during training (`clipping.adaptive_delta` has the schedules, the controller's step
and the settings): what the trainer updates after each optimizer step and saves in every checkpoint."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from atr_grpo.clipping.adaptive_delta import (
    DELTA_CONTROL_DEFAULTS,
    check_delta_control,
    controlled_delta,
    scheduled_delta,
)

log = logging.getLogger(__name__)


@dataclass
class DeltaControl:
    """The δ in force for a δ-rule during training, and how it changes after each optimizer step.

    `settings` holds the keys of `DELTA_CONTROL_PARAMS` (a missing one takes its default); `steps_per_rollout` optimizer
    steps share one generation, the first of them on-policy. The trainer calls `observe` for each micro-batch (its
    `kl/kl3_mean` and token count), then `end_step` after each optimizer step.
    """

    initial: float
    total_steps: int
    steps_per_rollout: int = 1
    settings: dict[str, Any] = field(default_factory=dict)
    delta: float = field(init=False)
    _kl3_sum: float = field(init=False, default=0.0)
    _tokens: float = field(init=False, default=0.0)
    _non_finite: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.settings = {**DELTA_CONTROL_DEFAULTS, **self.settings}
        check_delta_control(self.settings, self.initial)
        self.delta = self.initial

    @property
    def adapts(self) -> bool:
        """Whether δ can change during the run (a schedule or a controller)."""
        return self.settings["delta_schedule"] != "constant" or self.settings["target_kl3"] is not None

    def observe(self, kl3_mean: float, tokens: int) -> None:
        """A micro-batch's mean KL3 over its `tokens` valid tokens (before this step's update). A non-finite value
        (a NaN loss) is left out, and said so at the end of the step, rather than turning δ into NaN."""
        if tokens > 0 and not math.isfinite(kl3_mean):
            self._non_finite += 1
        elif tokens > 0:
            self._kl3_sum += kl3_mean * tokens
            self._tokens += tokens

    def end_step(self, steps_done: int, all_reduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None) -> None:
        """After the optimizer step that made `steps_done` steps in all: the δ of the next step.

        `all_reduce(tensor, "sum")` pools the step's KL3 over processes; every process calls this after every step.
        """
        pooled = torch.tensor([self._kl3_sum, self._tokens], dtype=torch.float64)
        if self._non_finite:
            left_out = "micro-batches with a non-finite kl/kl3_mean left out of δ's update"
            log.warning("step %d: %d %s", steps_done, self._non_finite, left_out)
        self._kl3_sum, self._tokens, self._non_finite = 0.0, 0.0, 0
        settings = self.settings
        if settings["delta_schedule"] != "constant":
            progress = steps_done / max(self.total_steps - 1, 1)
            self.delta = scheduled_delta(self.initial, settings["delta_final"], settings["delta_schedule"], progress)
            return
        if settings["target_kl3"] is None:
            return
        kl3_sum, tokens = (pooled if all_reduce is None else all_reduce(pooled, "sum")).tolist()
        reused_rollout = (steps_done - 1) % self.steps_per_rollout != 0
        if reused_rollout and tokens > 0:
            self.delta = controlled_delta(
                self.delta,
                kl3_sum / tokens,
                settings["target_kl3"],
                settings["delta_rate"],
                settings["delta_min"],
                settings["delta_max"],
            )

    def state_dict(self) -> dict[str, Any]:
        return {"delta": self.delta, "initial": self.initial, **self.settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The δ saved with a checkpoint of the same run (its settings must match: a resume never mixes runs)."""
        mine = {key: value for key, value in self.state_dict().items() if key != "delta"}
        theirs = {key: state.get(key) for key in mine}
        if theirs != mine:
            raise ValueError(f"the checkpoint's δ settings {theirs} differ from this run's {mine}")
        self.delta = float(state["delta"])
