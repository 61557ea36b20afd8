"""ERC, Entropy Ratio Clipping (Su et al. 2025, arXiv 2512.05591, Kwai Klear): DAPO's or GPPO's loss, with a
token's update dropped when the entropy of the whole next-token distribution has moved too far since π_old.

PPO's clip sees only the sampled token's ratio; the mass moved among unsampled tokens shows in the entropy. ERC
keeps a token's gradient only while the entropy ratio ρ^H_t stays inside an open interval around 1:

    ρ^H_t = (H(π_θ(·|s_t)) + 1e-8) / (H(π_old(·|s_t)) + 1e-8)            (the extra `entropy_ratio`)
    loss_t = L^base_t                 if 1 − β_low < ρ^H_t < 1 + β_high
             sg(L^base_t)             otherwise (value kept, no gradient)

L^base is DAPO's clip with the dual clip (`ppo_clip_terms`, c = 10) or GPPO's (`gppo.py`), the two bases of the
paper. Written from the authors' code (Kwai-Klear/ERC, `compute_policy_loss_grpo_erc` and `gppo_erc`: strict
inequalities, the 1e-8, `torch.where(mask, loss, loss.detach())`) and recipes (`recipe/dapo/*_erc_1_05.sh`):
β_low = β_high = 0.05; DAPO-ERC ε = (0.2, 0.28), GPPO-ERC ε = (0.2, 0.2); c = 10. The trainer computes both
entropies from π_old's kept weights (`training.token_entropy.entropy_ratio`); on-policy the ratio is 1 and ERC is its
base. `erc/frac_dropped` counts the tokens outside the interval (also in `clip/frac`), `erc/entropy_ratio` its mean.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import RuleTerms, TokenBatch, choice, open_unit, positive, register
from atr_grpo.clipping.gppo import gppo_terms
from atr_grpo.clipping.ratio import DualClipRule, dual_clip_params, ppo_clip_terms


@register
class ERC(DualClipRule):
    """DAPO (or GPPO) whose token loses its gradient when H(π_θ)/H(π_old) leaves (1 − β_low, 1 + β_high)."""

    name = "erc"
    family = "ratio"
    needs = ("entropy_ratio",)
    params = (
        choice("base", "dapo", ("dapo", "gppo"), "the loss ERC is stacked on (paper: DAPO and GPPO)"),
        *dual_clip_params(0.2, 0.28, 10.0, "ERC's DAPO recipe; its GPPO recipe uses eps_high 0.2"),
        open_unit("beta_low", 0.05, "lower entropy-ratio bound 1 − β_low (ERC recipe: entropy_mask_low 0.95)"),
        positive("beta_high", 0.05, "upper entropy-ratio bound 1 + β_high (ERC recipe: entropy_mask_high 1.05)"),
    )
    summary = "DAPO (or GPPO) loss; its gradient is dropped where H(π_θ)/H(π_old) ∉ (1 − β_low, 1 + β_high)"
    source = "ERC (arXiv 2512.05591); authors' code and recipes (Kwai-Klear/ERC, grpo_erc / gppo_erc)"

    def terms(self, batch: TokenBatch, entropy_ratio: Tensor, **_: Any) -> RuleTerms:
        low, high = 1 - self.eps_low, 1 + self.eps_high
        if self.base == "dapo":
            base = ppo_clip_terms(batch, low, high, dual_c=self.c)
        else:
            base = gppo_terms(batch, low, high, 1.0, 1.0, self.c)
        entropy_ratio = entropy_ratio.detach().to(base.loss.dtype)
        inside = (entropy_ratio > 1 - self.beta_low) & (entropy_ratio < 1 + self.beta_high)
        dropped = batch.mask & ~inside
        return RuleTerms(
            loss=torch.where(inside, base.loss, base.loss.detach()),
            frozen_low=base.frozen_low,
            frozen_high=base.frozen_high,
            frozen_other=dropped,
            extra={**base.extra, "erc/frac_dropped": dropped, "erc/entropy_ratio": entropy_ratio},
        )

    def ratio_bounds(self) -> None:
        return None  # ERC also drops tokens inside the clip interval, by their entropy ratio

    def bounds_text(self) -> str:
        return (
            f"{self.base.upper()} w ∈ [{1 - self.eps_low:.3g}, {1 + self.eps_high:.3g}] (dual clip {self.c:g}), "
            f"H(π_θ)/H(π_old) ∈ ({1 - self.beta_low:g}, {1 + self.beta_high:g})"
        )
