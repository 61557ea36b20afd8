"""The general clipping operator of the paper (Eq. 5) and the KL-family rules built on it.

    clip_general(w_t, C) = w_t          if the constraint C_t(θ) holds
                           w_t(θ_old)   otherwise          (w_t(θ_old) = 1, a constant)

Used inside PPO's min (`semantics="min"`, the paper's reading, which gives Theorem 4.1):

    J_t = min(w_t A_t, clip_general(w_t, C) A_t)

a token violating C keeps its value but loses its gradient exactly when w_t A_t > A_t, i.e. on the
side its advantage pushes (A > 0 and w > 1, or A < 0 and w < 1). This is Truly-PPO's TR-PPO rule.
`semantics="mask"` uses the operator alone (J_t = clip_general(w_t, C) A_t), freezing every violating
token whatever the sign of A: a two-sided ablation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from atr_grpo.clipping.base import RuleTerms, TokenBatch, ratio_from_log


def general_operator(batch: TokenBatch, inside: Tensor, semantics: str) -> RuleTerms:
    """Per-token loss of Eq. 5 for a boolean constraint `inside` `[B, T]` (no gradient through it).

    The frozen branch is the constant w(θ_old) · A = A, so a frozen token contributes its value but no
    gradient; a token inside the constraint contributes -w·A with gradient -A·w·∇log π.
    """
    ratio = ratio_from_log(batch.log_ratio)
    adv = batch.advantages
    violated = ~inside.detach()
    if semantics == "min":
        # w·A > A ⇔ (A > 0 and w > 1) or (A < 0 and w < 1); decided in log space, exactly.
        pushes_out = ((adv > 0) & (batch.log_ratio > 0)) | ((adv < 0) & (batch.log_ratio < 0))
        frozen = violated & pushes_out
    elif semantics == "mask":
        frozen = violated
    else:  # validated by the rule's parameters; kept for direct callers
        raise ValueError(f"semantics must be 'min' or 'mask', got {semantics!r}")
    loss = -torch.where(frozen, adv, ratio * adv)
    above = batch.log_ratio > 0
    return RuleTerms(loss=loss, frozen_low=frozen & ~above, frozen_high=frozen & above)
