"""CPPO (arXiv 2606.10968, Tencent Hunyuan): DPPO's mask with a threshold that grows along the completion and a
cumulative budget on the prefix's divergence.

A shift at an early token changes the distribution of every later state, so CPPO holds early tokens to a tighter
threshold, and stops a completion's updates once the divergence summed over its prefix runs out of budget. With
D_t the binary divergence of DPPO (`dppo.py`; TV: |π_θ(y_t) − π_old(y_t)|, KL: the Bernoulli KL) and t the index of
the token among its sequence's valid tokens:

    δ_t = δ·min(1, (t + 1)/ramp)                  the position-weighted threshold
    v_t = [not (D_t > δ_t and π_θ(y_t) moved the way A_t pushes)] · [Σ_{s≤t} D_s ≤ budget]
    loss_t = −A_t·sg(min(w_t, c))·log π_θ(y_t) · v_t                    (DPPO's loss)

No code was found (project page only). The law is the paper's rule as stated: a position-weighted threshold and a
prefix budget on a binary divergence. The shape of δ_t (a linear ramp over `ramp` tokens) and the defaults of
`ramp` and `budget` are this project's. δ and c are DPPO's (0.15 for TV; use 0.05 with `divergence=kl`). With
`ramp = 1` and a budget never reached it is DPPO-Binary exactly. `clip/frac_*` count every dropped token by the
sign of its advantage, as DPPO does; `cppo/frac_over_budget` counts those past the budget.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    ClipRule,
    RuleTerms,
    TokenBatch,
    choice,
    number,
    open_unit,
    positive,
    ratio_from_log,
    register,
)
from atr_grpo.clipping.dppo import binary_kl, outside_on_the_pushed_side


@register
class CPPO(ClipRule):
    """DPPO-Binary with δ_t rising over the first `ramp` tokens and a budget on Σ_{s≤t} D_s."""

    name = "cppo"
    family = "divergence"
    params = (
        choice("divergence", "tv", ("tv", "kl"), "the binary divergence D_t: total variation or Bernoulli KL"),
        open_unit("delta", 0.15, "δ, the threshold from token `ramp` on (DPPO-TV: 0.15; DPPO-KL: 0.05)"),
        number("ramp", 16, "an integer ≥ 1", lambda v: v == int(v) and v >= 1, "tokens over which δ_t rises to δ"),
        positive("budget", 2.0, "the prefix budget Σ_{s≤t} D_s (this project's default)"),
        number("c", 1e4, "a number ≥ 1", lambda v: v >= 1, "IS-weight truncation min(w, c) (DPPO recipe: 1e4)"),
    )
    summary = "DPPO's loss while D_t ≤ δ·min(1, (t+1)/ramp) on the side A pushes and Σ_{s≤t} D_s ≤ budget, else 0"
    source = (
        "CPPO (arXiv 2606.10968), position-weighted threshold and cumulative prefix budget; no code found: the law "
        "is the paper's rule, the ramp's shape and the defaults of ramp and budget are this project's"
    )

    def divergences(self, old_logp: Tensor, logp: Tensor) -> tuple[Tensor, Tensor]:
        """(D_t, π_θ − π_old) of each token."""
        change = torch.exp(logp) - torch.exp(old_logp)
        return (change.abs() if self.divergence == "tv" else binary_kl(old_logp, logp)), change

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        adv, mask = batch.advantages, batch.mask
        with torch.no_grad():
            divergence, change = self.divergences(batch.old_logp.clamp(max=0.0), batch.logp.detach().clamp(max=0.0))
            divergence = torch.where(mask, divergence, 0.0)
            position = torch.cumsum(mask, dim=-1)  # t + 1, counted over the valid tokens
            threshold = self.delta * (position.float() / self.ramp).clamp(max=1.0)
            over_budget = torch.cumsum(divergence, dim=-1) > self.budget
            dropped = outside_on_the_pushed_side(divergence, change, adv > 0, threshold) | over_budget
        weight = ratio_from_log(batch.log_ratio).detach().clamp(max=self.c)
        loss = torch.where(dropped, 0.0, -adv * weight * batch.logp)
        frozen = dropped & (adv != 0)
        return RuleTerms(
            loss=loss,
            frozen_low=frozen & (adv < 0),
            frozen_high=frozen & (adv > 0),
            extra={"cppo/frac_over_budget": over_budget},
        )

    def bounds_text(self) -> str:
        return (
            f"{self.divergence.upper()} D_t ≤ {self.delta:g}·min(1, (t+1)/{self.ramp:g}) on the side A pushes, "
            f"Σ_{{s≤t}} D_s ≤ {self.budget:g}"
        )
