"""VESPO (Shen et al. 2026, arXiv 2602.10693): a smooth Gamma-shaped weight of the sequence importance weight.

    W_i = Π_t π_θ(y_t|s_t) / π_sampler(y_t|s_t)           (a product over the sequence, not a length-normalised mean)
    φ(W) = e^λ · W^k · e^(−λW)                            (φ(1) = 1, largest at W = k/λ, → 0 as W → 0 or ∞)
    loss_t = −sg(φ(W_i))·A_t·log π_θ(y_t|s_t)

with (k, λ) = (k_pos, λ_pos) where A ≥ 0 and (k_neg, λ_neg) where A < 0. The weight is a constant of the gradient:
the gradient of a token is −φ(W_i)·A_t·∇log π_θ, no token's gradient is dropped, the weight only shrinks it.

The behaviour policy of W is the one that sampled the tokens, so W carries the rollout engine's mismatch as well as
the drift from π_old: W = Π_t w_t · r_t with w_t = π_θ/π_old and r_t = π_old/π_sampler. The rule owns the rollout
correction (`owns_correction`): it receives log r_t and folds it into W, as TRL's `loss_type="vespo"` folds its
token-level `importance_sampling_ratio` in (and multiplies no ratio after the loss). It needs vLLM rollouts; set
`rollout.correction=none`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    LOG_RATIO_LIMIT,
    ClipRule,
    Param,
    RuleTerms,
    TokenBatch,
    choice,
    number,
    positive,
    register,
)

# W is floored at 1e-8 in log space, as TRL floors it ("to match the original implementation"); a token ratio r
# masked to 0 (`is_mode=mask`) enters log W as this floor, which all but zeroes φ for its whole sequence
LOG_W_FLOOR = math.log(1e-8)
# λ is floored at 1e-4 (TRL's clamp); the check only asks λ > 0
LAMBDA_FLOOR = 1e-4


def _non_negative(name: str, default: float, doc: str) -> Param:
    return number(name, default, "a finite number ≥ 0", lambda v: v >= 0, doc)


@register
class VESPO(ClipRule):
    """VESPO's Gamma weight of the sequence importance weight, the behaviour policy being the rollout engine.

    Defaults and conventions are TRL 1.15's (`GRPOConfig.vespo_*`, `GRPOTrainer.get_gamma_weights`):
    k_pos = 2, λ_pos = 3, k_neg = 3, λ_neg = 2; every token log-ratio clamped to ±20, log W to [log 1e-8, 20];
    aggregation over tokens (TRL divides by the batch's token count: `token_mean`, the rule's `native_aggregation`).

    The engine's token ratio r_t enters W as TRL's token-level correction does, clamped to [is_min, is_max]
    (`is_mode=truncate`, TRL's `vllm_importance_sampling_mode="token_truncate"`) or set to 0 outside it
    (`is_mode=mask`, "token_mask"), with TRL's bounds: is_max = 3 (`vllm_importance_sampling_clip_max`), no lower
    bound (`clip_min=None`, here 0). TRL's default mode, sequence_mask, is refused by its VESPO, so a mode has to be
    chosen: `truncate` is our choice. Unlike TRL, log r is summed over the valid tokens only; the two agree when the
    band contains 1 (padding has r = 1), which the ranges of is_min and is_max ensure.

    `clip/frac` is always 0 (no token's gradient is dropped); `vespo/phi` is the weight's token-weighted mean (TRL
    logs `vespo/phi_seq_mean`, its mean over sequences) and `vespo/log_w` the mean log W.
    """

    name = "vespo"
    act_metric = None  # freezes no token: clip/frac is 0 by construction
    family = "soft"
    owns_correction = True
    native_aggregation = "token_mean"
    params = (
        _non_negative("k_pos", 2.0, "power k of φ where A ≥ 0: down-weights W < 1 (TRL vespo_k_pos: 2)"),
        positive("lambda_pos", 3.0, "decay λ of φ where A ≥ 0: down-weights W > 1 (TRL vespo_lambda_pos: 3)"),
        _non_negative("k_neg", 3.0, "power k of φ where A < 0 (TRL vespo_k_neg: 3)"),
        positive("lambda_neg", 2.0, "decay λ of φ where A < 0 (TRL vespo_lambda_neg: 2)"),
        choice(
            "is_mode",
            "truncate",
            ("truncate", "mask"),
            "how the engine's token ratio r = π_old/π_sampler enters W: clamped to [is_min, is_max] ('truncate', TRL "
            "token_truncate) or 0 outside it ('mask', TRL token_mask)",
        ),
        number("is_max", 3.0, "a finite number > 1", lambda v: v > 1, "upper bound of r (TRL clip_max: 3)"),
        number("is_min", 0.0, "a number in [0, 1)", lambda v: 0 <= v < 1, "lower bound of r; 0: none (TRL: None)"),
    )
    summary = "−sg(φ(W_i))·A·log π, φ(W) = e^λ·W^k·e^(−λW), W_i = Π_t π_θ/π_sampler (owns the rollout correction)"
    source = 'VESPO (Shen et al. 2026, arXiv 2602.10693); TRL 1.15 `loss_type="vespo"` (defaults, conventions)'

    def terms(self, batch: TokenBatch, sampling_log_ratio: Tensor, **_: Any) -> RuleTerms:
        mask = batch.mask
        # φ is a weight, a constant of the gradient: it is built from detached inputs only
        drift = batch.log_ratio.detach().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        engine = self.engine_log_ratio(sampling_log_ratio.detach().float())
        log_w = torch.where(mask, drift + engine, 0.0).sum(dim=-1, keepdim=True)  # [B, 1]: log W_i
        log_w = log_w.clamp(LOG_W_FLOOR, LOG_RATIO_LIMIT)
        positive_side = batch.advantages >= 0
        k = torch.where(positive_side, self.k_pos, self.k_neg)
        lam = torch.where(positive_side, self.lambda_pos, self.lambda_neg).clamp(min=LAMBDA_FLOOR)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))  # [B, T]: the sequence's weight on each token
        phi = torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)
        never = torch.zeros_like(mask)
        return RuleTerms(
            loss=-phi * batch.advantages * batch.logp,
            frozen_low=never,
            frozen_high=never,
            extra={"vespo/phi": phi, "vespo/log_w": log_w.expand_as(phi)},
        )

    def engine_log_ratio(self, log_r: Tensor) -> Tensor:
        """log r_t after the truncation or the mask of TRL's token-level correction, floored at log 1e-8."""
        log_max = math.log(self.is_max)
        log_min = math.log(self.is_min) if self.is_min > 0 else -math.inf
        if self.is_mode == "truncate":
            bounded = log_r.clamp(log_min, log_max)
        else:
            bounded = torch.where((log_r < log_min) | (log_r > log_max), LOG_W_FLOOR, log_r)
        return bounded.clamp(LOG_W_FLOOR, LOG_RATIO_LIMIT)

    def bounds_text(self) -> str:
        peaks = f"A ≥ 0: {self.k_pos / self.lambda_pos:.3g}, A < 0: {self.k_neg / self.lambda_neg:.3g}"
        band = f"[{self.is_min:g}, {self.is_max:g}]"
        engine = f"clamped to {band}" if self.is_mode == "truncate" else f"0 outside {band}"
        return f"φ(1) = 1, largest at W = k/λ ({peaks}); r = π_old/π_sampler {engine}"
