"""CFPO (Clipping-Free Policy Optimization, Çağatan et al. 2026, arXiv 2601.22801): a quadratic penalty, no clip.

The abstract says CFPO replaces the clip with a convex quadratic penalty derived from the total-variation
constraint, with no new hyperparameter. The authors' code is in TRL's history (huggingface/trl PR #5027, commit
afa266b5, `loss_type="cfpo"`): its per-token objective is −(A·r − |A|·(r − 1)²/(2·ε_high)), the penalty from the
trust region |w − 1| ≤ ε that this rule implements, with ε = ε_high (TRL's default 0.2):

    J_t = w·A − |A|/(2ε)·(w − 1)²,    loss_t = −J_t

(the objective of SPO, Xie et al. 2024, arXiv 2401.16025). It is differentiable everywhere and no token is ever
frozen: d J/d log π = w·(A − |A|·(w − 1)/ε), which is REINFORCE's −A at w = 1, vanishes exactly at PPO's bound on
the side the advantage pushes (w = 1 + ε for A > 0, 1 − ε for A < 0), and beyond it pulls the ratio back. Each
token's objective is maximal on that bound, which is how the penalty enforces the trust region without one.

That code aggregates per sequence (the mean over a completion's tokens), then over the batch (TRL's "grpo"
aggregation): `trainer.loss_agg=seq_mean` reproduces it; the rule itself leaves the aggregation to the run.
ε is PPO's clip range, 0.2 (no new hyperparameter, as the abstract says). `clip/frac` stays 0 (nothing is
clipped); `cfpo/frac_pulled_back` is the fraction of tokens past their optimum, whose gradient points back into
the region, and `cfpo/penalty` the mean penalty |A|/(2ε)·(w − 1)².
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, open_unit, ratio_from_log, register


@register
class CFPO(ClipRule):
    """Clipping-free policy optimisation: −(w·A − |A|/(2ε)·(w − 1)²), maximal at PPO's bound, never frozen."""

    name = "cfpo"
    act_metric = None  # freezes no token: clip/frac is 0 by construction
    family = "soft"
    params = (open_unit("eps", 0.2, "the trust region |w − 1| ≤ ε the penalty comes from (CFPO: PPO's ε, 0.2)"),)
    summary = "−(w·A − |A|/(2ε)·(w−1)²): a quadratic TV penalty instead of the clip, optimal at w = 1 ± ε"
    source = (
        "CFPO (Çağatan et al. 2026, arXiv 2601.22801); the authors' code in TRL PR #5027 (ε = ε_high), aggregating "
        "per sequence, then over the batch"
    )

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        adv = batch.advantages
        penalty = adv.abs() / (2 * self.eps) * (ratio - 1) ** 2
        never = torch.zeros_like(batch.mask)
        pulled_back = ((adv > 0) & (ratio > 1 + self.eps)) | ((adv < 0) & (ratio < 1 - self.eps))
        return RuleTerms(
            loss=penalty - ratio * adv,
            frozen_low=never,
            frozen_high=never,
            extra={"cfpo/frac_pulled_back": pulled_back, "cfpo/penalty": penalty.detach()},
        )
