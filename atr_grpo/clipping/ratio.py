"""Ratio-interval rules: REINFORCE with the ratio, PPO/GRPO clip, DAPO clip-higher, dual clip, RPG clip.

All of them constrain w = π_θ/π_old to an interval [low, high] inside PPO's min,

    J_t = min(w A, clip(w, low, high) A),

so a token loses its gradient only on the side its advantage pushes: A > 0 and w > high, or
A < 0 and w < low (TRL's `clip_ratio/{low,high}_mean` count exactly these sets).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    ClipRule,
    Param,
    RuleTerms,
    TokenBatch,
    number,
    open_unit,
    positive,
    ratio_from_log,
    register,
)


def ppo_clip_terms(
    batch: TokenBatch, low: float | Tensor, high: float | Tensor, dual_c: float | None = None
) -> RuleTerms:
    """PPO's clipped surrogate with ratio bounds `low`/`high` (floats or `[B, T]` tensors).

    With `dual_c`, negative-advantage tokens are also floored at c·A (Ye et al. 2020): a token with
    A < 0 and w > c keeps the constant value -c·A and no gradient.
    """
    ratio = ratio_from_log(batch.log_ratio)
    adv = batch.advantages
    negative = adv < 0
    frozen_low = negative & (ratio < low)
    frozen_high = (adv > 0) & (ratio > high)
    if dual_c is None:
        objective = torch.minimum(ratio * adv, torch.clamp(ratio, low, high) * adv)
        return RuleTerms(loss=-objective, frozen_low=frozen_low, frozen_high=frozen_high)
    # With the floor, per sign of A the objective is one clamp of w (fewer passes than min, then max):
    #   A > 0: min(wA, clip(w)A) = A·min(w, high);   A < 0: max(min(wA, clip(w)A), cA) = A·clamp(w, low, c)
    # Each token's pair of bounds is picked by a 0/1 weight: a product and a lerp return one end bit for bit (lerp
    # at weight 0 or 1 adds 0·(end − start)), at a fraction of torch.where's cost on a CPU.
    pick = negative.to(ratio.dtype)
    high = high if isinstance(high, Tensor) else ratio.new_tensor(high)
    floor, ceiling = pick * low, torch.lerp(high, ratio.new_tensor(dual_c), pick)
    objective = torch.clamp(ratio, floor, ceiling) * adv
    dual = negative & (ratio > dual_c)
    return RuleTerms(
        loss=-objective, frozen_low=frozen_low, frozen_high=frozen_high | dual, extra={"clip/frac_dual": dual}
    )


@register
class NoClip(ClipRule):
    """REINFORCE with the importance ratio, loss -w·A: no constraint (a reference point)."""

    name = "no_clip"
    act_metric = None  # freezes no token: clip/frac is 0 by construction
    family = "reference"
    summary = "−w·A, no constraint"
    source = "REINFORCE with the ratio (Williams 1992)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        never = torch.zeros_like(batch.mask)
        return RuleTerms(loss=-ratio * batch.advantages, frozen_low=never, frozen_high=never)


@register
class Clip(ClipRule):
    """PPO / GRPO symmetric clip, w ∈ [1 - ε, 1 + ε] (paper Eq. 3 with l = 1 - ε, u = 1 + ε)."""

    name = "clip"
    family = "ratio"
    params = (open_unit("eps", 0.2, "clip range ε (PPO/GRPO default 0.2)"),)
    summary = "w ∈ [1−ε, 1+ε]"
    source = "PPO (Schulman et al. 2017), GRPO (Shao et al. 2024); paper Eq. 3"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        return ppo_clip_terms(batch, 1 - self.eps, 1 + self.eps)

    def ratio_bounds(self) -> tuple[float, float]:
        return 1 - self.eps, 1 + self.eps


def clip_range(eps_low: float, eps_high: float, source: str) -> tuple[Param, Param]:
    """The (eps_low, eps_high) parameters of the ratio interval [1 - eps_low, 1 + eps_high], with the source's
    defaults."""
    return (
        open_unit("eps_low", eps_low, f"lower clip range, w ≥ 1 - eps_low ({source}: {eps_low:g})"),
        positive("eps_high", eps_high, f"upper clip range, w ≤ 1 + eps_high ({source}: {eps_high:g})"),
    )


def dual_clip_params(eps_low: float, eps_high: float, c: float, source: str) -> tuple[Param, ...]:
    """`clip_range` plus the dual-clip floor c (Ye et al. 2020), with the source's defaults."""
    doc = f"dual-clip floor: A < 0 frozen above w = c ({source}: {c:g})"
    floor = number("c", c, "a number > 1 + eps_high", lambda v: v > 1, doc)
    return (*clip_range(eps_low, eps_high, source), floor)


class ClipRangeRule(ClipRule):
    """A rule with parameters eps_low / eps_high whose interval is [1 - eps_low, 1 + eps_high]."""

    def ratio_bounds(self) -> tuple[float, float]:
        return 1 - self.eps_low, 1 + self.eps_high


@register
class ClipHigher(ClipRangeRule):
    """DAPO's decoupled clip, w ∈ [1 - ε_low, 1 + ε_high] with a larger upper range (DAPO §3.1)."""

    name = "clip_higher"
    family = "ratio"
    params = clip_range(0.2, 0.28, "DAPO")
    summary = "w ∈ [1−ε_low, 1+ε_high]"
    source = "DAPO (Yu et al. 2025) §3.1"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        return ppo_clip_terms(batch, 1 - self.eps_low, 1 + self.eps_high)


class DualClipRule(ClipRangeRule):
    """Rules with `dual_clip_params`: the floor c must lie above the upper clip bound."""

    def validate(self) -> None:
        if not self.c > 1 + self.eps_high:
            raise ValueError(
                f"clipping rule {self.name!r}: parameter 'c' must be > 1 + eps_high = {1 + self.eps_high:g} "
                f"(below it the floor c·A would cut into the clip range), got {self.c!r}"
            )

    def bounds_text(self) -> str:
        return f"{super().bounds_text()}; A < 0 also frozen above w = {self.c:g}"


@register
class DualClip(DualClipRule):
    """Dual-clip PPO (Ye et al. 2020): PPO's clip plus the floor c·A for A < 0, verl's default loss."""

    name = "dual_clip"
    family = "ratio"
    params = dual_clip_params(0.2, 0.2, 3.0, "verl default")
    summary = "clip, plus the floor c·A for A < 0"
    source = "Dual-clip PPO (Ye et al. 2020); verl's default loss"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        return ppo_clip_terms(batch, 1 - self.eps_low, 1 + self.eps_high, dual_c=self.c)


@register
class RPGClip(DualClipRule):
    """RPG's dual-clipped REINFORCE (Zhang et al. 2025): loss -sg(w)·A·log π on kept tokens.

    The gradient -A·w·∇log π equals the ratio surrogate's, and the frozen set is Dual-Clip's
    ({A > 0, w ≥ 1+ε_high} ∪ {A < 0, w < 1-ε_low or w ≥ c}), so the gradient is Dual-Clip's; only the
    loss *value* differs (it carries log π). Frozen tokens keep the same expression, detached.
    """

    name = "rpg_clip"
    family = "ratio"
    params = dual_clip_params(0.2, 0.28, 10.0, "RPG recipe")
    summary = "−sg(w)·A·log π with Dual-Clip's frozen set"
    source = "RPG (Zhang et al. 2025)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio).detach()
        adv = batch.advantages
        frozen_low = (adv < 0) & (ratio < 1 - self.eps_low)
        dual = (adv < 0) & (ratio >= self.c)
        frozen_high = ((adv > 0) & (ratio >= 1 + self.eps_high)) | dual
        surrogate = ratio * adv * batch.logp
        loss = -torch.where(frozen_low | frozen_high, surrogate.detach(), surrogate)
        return RuleTerms(loss=loss, frozen_low=frozen_low, frozen_high=frozen_high, extra={"clip/frac_dual": dual})
