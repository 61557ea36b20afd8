"""LUSPO (Liu et al. 2026, arXiv 2602.05261): GSPO with each sequence's loss scaled by its length."""

from __future__ import annotations

from atr_grpo.clipping.base import register
from atr_grpo.clipping.sequence import GSPO


@register
class LUSPO(GSPO):
    """Length-Unbiased Sequence Policy Optimization: GSPO's clipped sequence objective with each sequence's loss
    multiplied by its length |y_i|, so that a long answer is not under-weighted per token as under GSPO's mean over
    sequences:

        J = 1/B · Σ_i |y_i| · min(s_i·A_i, clip(s_i, 1 − ε_low, 1 + ε_high)·A_i),   s_i = exp(mean_t log w_{i,t}).

    The per-token loss is GSPO's (sequence i's value on each of its valid tokens, GSPO-token gradient); the length
    weighting is an aggregation: Σ_t over a sequence's tokens is |y_i| times its value. The rule's
    `native_aggregation` is therefore `dr_grpo`, Σ_tokens ℓ / (B·L_max), which is LUSPO's objective divided by the
    constant L_max (`trainer.max_completion_length`). TRL's `loss_type="luspo"` (with
    `importance_sampling_level="sequence"`, as TRL asks) computes `(ℓ·mask).sum(-1).mean()`, L_max times ours, in
    value and gradient (tests/clipping/test_rivals_trl.py); the constant only rescales the step (with Adam, up to ε
    and to gradient-norm clipping, whose threshold it moves). Under `token_mean` the weighting is the same with the
    batch's token count as the constant; under `seq_mean` LUSPO is GSPO.

    The clipping ranges are GSPO's, 3e-4 and 4e-4: LUSPO changes GSPO's aggregation only and the paper keeps GSPO's
    setup (a choice: TRL's `epsilon` default, 0.2, is the token-level one, which TRL's GSPO recipe overrides).
    """

    name = "luspo"
    native_aggregation = "dr_grpo"
    summary = "GSPO's clip of s_i = exp(mean_t log w_t) ∈ [1−ε_low, 1+ε_high], each sequence weighted by its length"
    source = 'LUSPO (Liu et al. 2026, arXiv 2602.05261); TRL 1.15 `loss_type="luspo"`'
