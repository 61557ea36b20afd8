"""CPPO (Mao et al. 2026, arXiv 2606.10968, Tencent Hunyuan): DPPO's token mask with a position-weighted threshold
and a cumulative prefix budget, written from the paper's §3.3-3.4, Algorithm 1, §4.1 and Table 3.

An early token's shift conditions every later token, so CPPO weighs the divergence D_t of token t (DPPO's, `dppo.py`:
binary TV |π_θ(y_t) − π_old(y_t)| or the Bernoulli KL) by a weight that falls along the response, and caps the
weighted average of D over every prefix. With t = 1..T the token's index among its row's T valid tokens:

    w_t = 1 − (1 − w_min)·(t − 1)/(T − 1)                                              (Eq. 9)
    Z_t = w_t·D_t,   S_t = Σ_{s≤t} Z_s,   W_t = Σ_{s≤t} w_s                             (Algorithm 1)
    M_t = 1[A_t·(ρ_t − 1) ≤ 0  or  Z_t ≤ min(δ, δ + δ_b·W_{t−1} − S_{t−1})]           (Eq. 8, 10)
    loss_t = −M_t·ρ_t·A_t,   ρ_t = π_θ/π_old                                            (Eq. 11)

The token threshold δ/w_t rises from δ to δ/w_min; a token under it is still masked once the prefix's weighted
average runs over δ_b. A token moving its ratio back toward 1 is never masked; S and W count every token (step 9).
The loss has no IS truncation. `budget_mode=p90` is the Base-model calibration (Eq. 22): δ_b per row is
clamp(P90(D_1:T), δ_b, 2δ_b), P90 by linear interpolation (ours: the paper does not say). Defaults: Table 3's
Qwen3-1.7B row. The paper's main runs take D as a top-K (K = 20) TV, its Fig. 6 finds the binary TV comparable; with
the KL it uses δ = 0.1, δ_b = 0.002 (§4.3). `cppo/frac_over_budget` counts the tokens masked by the budget alone.
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
    open_unit,
    positive,
    ratio_from_log,
    register,
)
from atr_grpo.clipping.dppo import binary_kl


def row_p90(values: Tensor, mask: Tensor) -> Tensor:
    """`[B, 1]` 90th percentile of each row's valid values (linear interpolation, as torch.quantile); 0 if none."""
    ordered = torch.where(mask, values, torch.inf).sort(dim=-1).values
    count = mask.sum(-1, keepdim=True)
    position = 0.9 * (count - 1).clamp(min=0)
    below = position.floor().long()
    above = (below + 1).clamp(max=(count - 1).clamp(min=0))
    low, high = ordered.gather(-1, below), ordered.gather(-1, above)
    return torch.where(count > 0, low + (position - below) * (high - low), 0.0)


@register
class CPPO(ClipRule):
    """DPPO's mask with the threshold δ/w_t rising along the response and a budget δ_b on every prefix's average."""

    name = "cppo"
    family = "divergence"
    params = (
        choice("divergence", "tv", ("tv", "kl"), "D_t: DPPO's binary TV or Bernoulli KL (paper: top-K TV, Fig. 6)"),
        open_unit("delta", 0.15, "δ, the token-level threshold at the first token (Table 3: 0.15 dense, 0.2 MoE)"),
        open_unit("w_min", 0.8, "the last token's position weight; its threshold is δ/w_min (Table 3: 0.8)"),
        positive("budget", 0.015, "δ_b, the weighted prefix average allowed (Table 3: 0.015 fixed; Base models 0.02)"),
        choice("budget_mode", "fixed", ("fixed", "p90"), "δ_b, or clamp(P90 of the row's D, δ_b, 2δ_b) (Eq. 22)"),
    )
    summary = "−M·w·A, M: A pushes w back to 1, or w_t·D_t ≤ min(δ, δ + δ_b·W_{t−1} − S_{t−1}), w_t from 1 to w_min"
    source = "CPPO (arXiv 2606.10968), Eq. 8-11 and Algorithm 1; defaults Table 3 (Qwen3-1.7B); no code released"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        adv, mask = batch.advantages, batch.mask
        ratio = ratio_from_log(batch.log_ratio)
        with torch.no_grad():
            old_logp, logp = batch.old_logp.clamp(max=0.0), batch.logp.detach().clamp(max=0.0)
            change = torch.exp(logp) - torch.exp(old_logp)  # sign of w − 1
            divergence = change.abs() if self.divergence == "tv" else binary_kl(old_logp, logp)
            divergence = torch.where(mask, divergence, 0.0)
            position = torch.cumsum(mask, dim=-1)  # t, over the row's valid tokens
            length = mask.sum(-1, keepdim=True)  # T
            weight = 1 - (1 - self.w_min) * (position - 1) / (length - 1).clamp(min=1)
            weight = torch.where(mask, weight, 0.0)
            weighted = weight * divergence  # Z_t
            spent, mass = torch.cumsum(weighted, -1) - weighted, torch.cumsum(weight, -1) - weight  # S_{t−1}, W_{t−1}
            budget = self.budget
            if self.budget_mode == "p90":
                budget = row_p90(divergence, mask).clamp(self.budget, 2 * self.budget)
            prefix_room = self.delta + budget * mass - spent
            outward = adv * change > 0  # the update moves w away from 1
            dropped = mask & outward & (weighted > torch.clamp(prefix_room, max=self.delta))
            over_budget = dropped & (weighted <= self.delta)
        frozen = dropped & (adv != 0)
        return RuleTerms(
            loss=torch.where(dropped, 0.0, -ratio * adv),
            frozen_low=frozen & (adv < 0),
            frozen_high=frozen & (adv > 0),
            extra={"cppo/frac_over_budget": over_budget},
        )

    def bounds_text(self) -> str:
        mode = "" if self.budget_mode == "fixed" else ", δ_b per row from its P90"
        return (
            f"{self.divergence.upper()} w_t·D_t ≤ min({self.delta:g}, {self.delta:g} + {self.budget:g}·W_{{t−1}} − "
            f"S_{{t−1}}), w_t from 1 to {self.w_min:g}{mode}"
        )
