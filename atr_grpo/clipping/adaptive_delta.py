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
compiled inside Unsloth's trainer. This module holds the settings and the arithmetic; the trainer's
`training.delta_control.DeltaControl` holds the δ in force and is saved in every checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

from atr_grpo.clipping.base import RULES, Param, choice, positive
from atr_grpo.clipping.kl import DivergenceRule

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
