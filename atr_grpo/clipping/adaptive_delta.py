"""δ that changes during training, for every rule with a threshold δ (the paper's §6.5 "adaptive trust-region
thresholds"): atr, atr_seq, kl1, kl2, is_kl3, full_kl, i.e. the `DivergenceRule`s.

Two sources, set with `clipping.*` keys next to the rule's own (refused on rules without δ):

    delta_schedule   constant | linear | cosine, from `delta` (δ₀) to `delta_final` (δ₁) over trainer.max_steps (N):
                         δ = δ₁ + (δ₀ − δ₁)·f(k/(N − 1)),   f_linear(p) = 1 − p,   f_cosine(p) = ½(1 + cos πp)
                     with k the optimizer steps done: the first step trains with δ₀, the last with δ₁.

    target_kl3       m*: PPO's adaptive KL coefficient (Schulman et al. 2017 §4) turned on δ. After each optimizer
                     step that reuses a rollout, with m its measured `kl/kl3_mean` (pooled over the step's
                     micro-batches and processes), a proportional update in log space (Ziegler et al. 2019; verl's
                     `AdaptiveKLController`):
                         log δ ← clip(log δ − η·clip(m/m* − 1, −0.2, 0.2), log δ_min, log δ_max)
                     Too large a KL3 tightens the trust region, too small a KL3 widens it. Bounds: one step moves
                     δ by a factor within [e^(−0.2η), e^(0.2η)] (`delta_rate` = η), and δ stays in
                     [`delta_min`, `delta_max`]. The first step after each generation is on-policy (w ≡ 1, KL3 = 0
                     whatever δ is) and carries no signal, so only steps that reuse a rollout update δ.

Only δ changes: the interval of KL3 ≤ δ stays the asymmetric [l_δ, u_δ] (Thm 4.2) at every step. The rule takes δ
as a 0-d tensor extra (`DivergenceRule.terms(batch, delta=...)`), so a new value does not recompile the loss
compiled inside Unsloth's trainer. `DeltaControl` holds the δ in force and is saved in every checkpoint.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from atr_grpo.clipping.base import RULES, Param, choice, positive
from atr_grpo.clipping.kl import DivergenceRule

log = logging.getLogger(__name__)

SCHEDULES = ("constant", "linear", "cosine")
# the largest relative error m/m* − 1 one controller step acts on (Ziegler et al. 2019, verl)
ERROR_CLIP = 0.2


def _positive_or_none(name: str, doc: str) -> Param:
    allowed = "null or a finite number > 0"
    return Param(name, None, allowed, lambda v: v is None or (_finite(v) and v > 0), doc)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# the clipping.* keys every δ-rule accepts besides its own parameters
DELTA_CONTROL_PARAMS = (
    choice("delta_schedule", "constant", SCHEDULES, "how δ moves from `delta` to `delta_final` over max_steps"),
    _positive_or_none("delta_final", "δ at the last step of a linear or cosine schedule"),
    _positive_or_none("target_kl3", "the mean KL3 per update that adaptive δ drives toward (null: no controller)"),
    positive("delta_rate", 0.1, "the controller's gain η: one step changes log δ by at most 0.2·η"),
    positive("delta_min", 0.01, "the controller's lower bound on δ"),
    positive("delta_max", 0.5, "the controller's upper bound on δ"),
)
DELTA_CONTROL_DEFAULTS = {param.name: param.default for param in DELTA_CONTROL_PARAMS}


def takes_delta(rule_name: str) -> bool:
    """Whether a registered rule has a threshold δ that may change during training."""
    return issubclass(RULES[rule_name], DivergenceRule)


def delta_rules() -> list[str]:
    return sorted(name for name in RULES if takes_delta(name))


def scheduled_delta(initial: float, final: float, schedule: str, progress: float) -> float:
    """δ at `progress` ∈ [0, 1] of training (clamped) under `schedule`."""
    p = min(max(progress, 0.0), 1.0)
    if schedule == "constant":
        return initial
    if schedule == "linear":
        remaining = 1.0 - p
    elif schedule == "cosine":
        remaining = 0.5 * (1.0 + math.cos(math.pi * p))
    else:
        raise ValueError(f"delta_schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return final + (initial - final) * remaining


def controlled_delta(delta: float, measured: float, target: float, rate: float, low: float, high: float) -> float:
    """One controller step: δ after an update whose mean KL3 was `measured` (see the module)."""
    error = min(max(measured / target - 1.0, -ERROR_CLIP), ERROR_CLIP)
    log_delta = math.log(delta) - rate * error
    return min(max(math.exp(log_delta), low), high)


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


def check_delta_control(values: dict[str, Any], delta: float) -> None:
    """Refuse δ-control settings that contradict each other or the rule's δ; the message names the key."""
    values = {**DELTA_CONTROL_DEFAULTS, **values}
    for param in DELTA_CONTROL_PARAMS:
        if not param.check(values[param.name]):
            raise ValueError(f"{param.name} must be {param.allowed}, got {values[param.name]!r}")
    schedule, final, target = values["delta_schedule"], values["delta_final"], values["target_kl3"]
    if schedule == "constant" and final is not None:
        raise ValueError(
            "delta_final is only read by the linear and cosine delta_schedule; set one, or delta_final=null"
        )
    if schedule != "constant" and final is None:
        raise ValueError(f"delta_final must be set (> 0) with delta_schedule={schedule}")
    if schedule != "constant" and target is not None:
        raise ValueError(f"target_kl3 and delta_schedule={schedule} both set δ; choose one (the other null/constant)")
    if target is None:  # the bounds are the controller's: without it they would be accepted and never read
        for key in ("delta_min", "delta_max"):
            if values[key] != DELTA_CONTROL_DEFAULTS[key]:
                raise ValueError(
                    f"{key} is only read by adaptive δ (target_kl3); set target_kl3, or leave {key} at its "
                    f"default {DELTA_CONTROL_DEFAULTS[key]:g}, got {values[key]!r}"
                )
    else:
        low, high = values["delta_min"], values["delta_max"]
        if not low < high:
            raise ValueError(f"delta_min must be < delta_max={high:g}, got {low!r}")
        if not low <= delta <= high:
            raise ValueError(
                f"delta must lie in [delta_min, delta_max] = [{low:g}, {high:g}] with target_kl3, got {delta!r}"
            )
