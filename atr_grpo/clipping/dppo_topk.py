"""DPPO's top-K rules (Qi et al. 2026, arXiv 2602.04879): DPPO with the divergence estimated over π_old's top K
tokens, beside the binary estimates of `dppo_tv` and `dppo_kl`.

The binary estimates compare π_θ and π_old on two categories, the sampled token and everything else. The top-K
estimates split "everything else" into π_old's K most likely tokens and the rest (the extras `topk_tv` and
`topk_kl`, `clipping.extras`; the trainer computes them in `training/topk_divergence.py`). The mask and the loss
are DPPO's:

    v_t = not (D_t > δ and π_θ(y_t) − π_old(y_t) moved the way A_t pushes),    δ = δ_high (A > 0), δ_low (A < 0)
    loss_t = −A_t·sg(min(w_t, c))·log π_θ(y_t)·v_t

For the binary TV, D_t = |π_θ(y_t) − π_old(y_t)|, this test is `dppo_tv`'s signed one, and for the Bernoulli KL
it is `dppo_kl`'s: with the binary estimates as extras these rules are DPPO-Binary exactly (tested). The authors'
code (sail-sg/Stable-RL, `compute_topk_kl` and `_compute_token_mask_for_policy_loss`) confirms the mask, the
categories' TV ½(Σ|p − q| + |rest|) and KL(π_old ‖ π_θ). Two differences, both small: it takes the top K from the
rollout engine's log-probs and, when y_t is not among them, puts y_t in place of the K-th token (K categories, not
K + 1); and it clamps the masses at 1e-12 where verl's binary KL adds 1e-8. K = 20 (`extras.TOPK_K`) is the value
CPPO's authors use "following the DPPO approximation construction" (arXiv 2606.10968, §4.1); the released code
leaves K to the rollout's `logprobs` setting. Defaults are DPPO's binary recipe (δ 0.15 for TV, 0.05 for KL,
c = 1e4). verl's policy-loss API passes no top-K log-probs, so the verl plugin refuses these rules.
"""

from __future__ import annotations

from typing import Any

import torch

from atr_grpo.clipping.base import ClipRule, RuleTerms, TokenBatch, ratio_from_log, register
from atr_grpo.clipping.dppo import _dppo_params, outside_on_the_pushed_side


class _DPPOTopK(ClipRule):
    """DPPO's loss with the divergence D_t read from the extra the rule needs."""

    family = "divergence"

    def terms(self, batch: TokenBatch, **extras: Any) -> RuleTerms:
        (divergence,) = (extras[name] for name in self.needs)
        adv = batch.advantages
        ratio = ratio_from_log(batch.log_ratio).detach()
        with torch.no_grad():
            change = torch.exp(batch.logp.detach().clamp(max=0.0)) - torch.exp(batch.old_logp.clamp(max=0.0))
            threshold = torch.where(adv > 0, self.delta_high, self.delta_low)
            dropped = outside_on_the_pushed_side(divergence.detach().to(change.dtype), change, adv > 0, threshold)
        loss = torch.where(dropped, 0.0, -adv * ratio.clamp(max=self.c) * batch.logp)
        frozen = dropped & (adv != 0)
        return RuleTerms(
            loss=loss,
            frozen_low=frozen & (adv < 0),
            frozen_high=frozen & (adv > 0),
            extra={"kl/estimate_mean": divergence.detach().float()},
        )

    def bounds_text(self) -> str:
        return f"top-K estimate ≤ {self.delta_high:g} (A > 0) / {self.delta_low:g} (A < 0) on the side A pushes"


@register
class DPPOTopKTV(_DPPOTopK):
    """DPPO-TopK-TV: the total variation over π_old's top-K tokens, the sampled one and the rest ≤ δ."""

    name = "dppo_topk_tv"
    needs = ("topk_tv",)
    params = _dppo_params(0.15)
    summary = "dppo_tv with the TV over π_old's top-K tokens, the sampled token and the rest, not the binary TV"
    source = "DPPO-TopK-TV (Qi et al. 2026, arXiv 2602.04879); authors' code sail-sg/Stable-RL; K = 20 as CPPO §4.1"


@register
class DPPOTopKKL(_DPPOTopK):
    """DPPO-TopK-KL: KL(π_old ‖ π_θ) over π_old's top-K tokens, the sampled one and the rest ≤ δ."""

    name = "dppo_topk_kl"
    needs = ("topk_kl",)
    params = _dppo_params(0.05)
    summary = "dppo_kl with the KL over π_old's top-K tokens, the sampled token and the rest, not the Bernoulli KL"
    source = "DPPO-TopK-KL (Qi et al. 2026, arXiv 2602.04879); authors' code sail-sg/Stable-RL; K = 20 as CPPO §4.1"
