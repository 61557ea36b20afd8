"""The general operator (Eq. 5) with divergence constraints: ATR (KL3) and the Table 3 alternatives.

Each rule evaluates a per-token estimator of the divergence between π_old and π_θ and keeps w_t where
it is ≤ δ; elsewhere the operator substitutes the constant w(θ_old) = 1 (see `general.py`). With
Schulman's convention (samples from π_old, r = π_θ/π_old = w) the estimators of KL(π_old ‖ π_θ) are

    k1 = -log w,    k2 = ½ (log w)²,    k3 = w - 1 - log w    (the paper's KL3, Eq. 6)

Estimators are evaluated on the log-ratio s = log w, in a form that does not cancel near s = 0
(k3 = expm1(s) - s), with s clamped to ±20: every estimator is monotone beyond, so no decision changes
for any δ below k3(-20) ≈ 19.
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
    positive,
    register,
)
from atr_grpo.clipping.base import semantics_param as _semantics
from atr_grpo.clipping.bounds import divergence_ratio_interval, kl3_ratio_bounds
from atr_grpo.clipping.general import general_operator


def clamped_log_ratio(batch: TokenBatch) -> Tensor:
    """s = log w without gradient, clamped to ±LOG_RATIO_LIMIT (every estimator is monotone beyond)."""
    return batch.log_ratio.detach().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def k3(s: Tensor) -> Tensor:
    """KL3 = w - 1 - log w ≥ 0, from s = log w."""
    return torch.expm1(s) - s


def delta_param() -> Param:
    return positive("delta", 0.07, "trust-region threshold δ (§6.4: 0.07)")


class DivergenceRule(ClipRule):
    """A rule whose constraint is `estimate(batch) ≤ delta`, applied through the general operator."""

    family = "divergence"

    def estimate(self, batch: TokenBatch, **extras: Any) -> Tensor:
        raise NotImplementedError

    def terms(self, batch: TokenBatch, delta: Tensor | None = None, **extras: Any) -> RuleTerms:
        """`delta`: the threshold in force as a 0-d tensor (adaptive δ, `adaptive_delta.py`); None = `self.delta`.
        A tensor keeps a compiled loss from recompiling when δ changes."""
        estimate = self.estimate(batch, **extras)
        threshold = self.delta if delta is None else delta.to(estimate.dtype)
        terms = general_operator(batch, estimate <= threshold, self.semantics)
        terms.extra["kl/estimate_mean"] = estimate
        return terms

    def bounds_text(self) -> str:
        """The base text (one interval, or per-token bounds at sample values of π_old), after 'δ = … ⇔'."""
        text = super().bounds_text()
        if not text:
            return ""
        reading = "" if self.semantics == "min" else " (mask semantics: frozen outside whatever the sign of A)"
        return f"δ = {self.delta:g} ⇔ {text}{reading}"


@register
class ATR(DivergenceRule):
    """ATR-GRPO: KL3 = w - 1 - log w ≤ δ (paper §4.2). Under min semantics its gradient is exactly
    Clip-Higher's with ε_low = 1 - l_δ, ε_high = u_δ - 1 (Thm 4.1 + Thm 4.2); for δ = 0.07, [0.671, 1.422]."""

    name = "atr"
    params = (delta_param(), _semantics())
    summary = "KL3 = w − 1 − log w ≤ δ"
    source = "ATR-GRPO (this paper), Eq. 5–6 and 10"

    def estimate(self, batch: TokenBatch, **_: Any) -> Tensor:
        return k3(clamped_log_ratio(batch))

    def ratio_bounds(self) -> tuple[float, float]:
        return kl3_ratio_bounds(self.delta)


@register
class KL1(DivergenceRule):
    """k1 ≤ δ. Default reading -log w (Schulman's k1 with samples from π_old, the same direction
    KL(π_old ‖ π_θ) as the paper's KL3): w ≥ e^(-δ) with no upper bound, so under min semantics only
    negative-advantage tokens are ever frozen. `variant` offers the other readings: "log" (log w ≤ δ,
    w ≤ e^δ) and "abs_log" (|log w| ≤ δ, the symmetric interval)."""

    name = "kl1"
    params = (
        delta_param(),
        _semantics(),
        choice("variant", "neg_log", ("neg_log", "log", "abs_log"), "sign convention"),
    )
    summary = "k1 = −log w ≤ δ (`variant=log`, `abs_log`: the other readings)"
    source = "k1 (Schulman 2020); paper Table 3"

    def estimate(self, batch: TokenBatch, **_: Any) -> Tensor:
        s = clamped_log_ratio(batch)
        return {"neg_log": -s, "log": s, "abs_log": s.abs()}[self.variant]

    def ratio_bounds(self) -> tuple[float, float]:
        low, high = math.exp(-self.delta), math.exp(self.delta)
        return {"neg_log": (low, math.inf), "log": (0.0, high), "abs_log": (low, high)}[self.variant]


@register
class KL2(DivergenceRule):
    """k2 = ½ (log w)² ≤ δ ⇔ |log w| ≤ √(2δ): the symmetric-in-log interval [e^(-√2δ), e^(√2δ)]."""

    name = "kl2"
    params = (delta_param(), _semantics())
    summary = "k2 = ½ log² w ≤ δ"
    source = "k2 (Schulman 2020); paper Table 3"

    def estimate(self, batch: TokenBatch, **_: Any) -> Tensor:
        return 0.5 * clamped_log_ratio(batch) ** 2

    def ratio_bounds(self) -> tuple[float, float]:
        radius = math.sqrt(2 * self.delta)
        return math.exp(-radius), math.exp(radius)


@register
class ISKL3(DivergenceRule):
    """Importance-weighted KL3 ≤ δ.

    Default `form="reverse"`: w · k3(1/w) = 1 - w + w log w, the k3 estimator of the reverse direction
    KL(π_θ ‖ π_old) made unbiased under π_old samples by the weight w (the correction of the RPG paper,
    which the paper's "IS-weighted" name points to). It is convex with minimum 0 at w = 1, so it is
    again an interval: [0.650, 1.397] for δ = 0.07. `form="literal"` is w · (w - 1 - log w), which is not
    convex and tends to 0 as w → 0, so tiny ratios count as inside: kept as an ablation.
    """

    name = "is_kl3"
    params = (delta_param(), _semantics(), choice("form", "reverse", ("reverse", "literal"), "which weighting"))
    summary = "w·k3(1/w) = 1 − w + w log w ≤ δ (`form=literal`: w·k3(w))"
    source = "importance-weighted KL3 (RPG, Zhang et al. 2025); paper Table 3"

    def estimate(self, batch: TokenBatch, **_: Any) -> Tensor:
        s = clamped_log_ratio(batch)
        if self.form == "reverse":
            return torch.exp(s) * s - torch.expm1(s)  # 1 - w + w log w
        return torch.exp(s) * k3(s)

    def ratio_bounds(self) -> tuple[float, float] | None:
        if self.form == "literal":  # not an interval: every small enough ratio is inside as well
            return None
        return divergence_ratio_interval(lambda w: 1 - w + w * math.log(w), self.delta)


@register
class FullKL(DivergenceRule):
    """KL(π_old(·|s_t) ‖ π_θ(·|s_t)) ≤ δ over the whole vocabulary (Truly-PPO / TRGPPO condition).

    The caller passes the exact per-token divergence as the extra `full_kl` ([B, T]); it is a property of
    the state, so every token at s_t sees the same constraint, decided without any gradient.
    """

    name = "full_kl"
    needs = ("full_kl",)
    params = (delta_param(), _semantics())
    summary = "full-vocabulary KL(π_old ‖ π_θ) ≤ δ (per state)"
    source = "TRGPPO / Truly PPO (Wang et al. 2019, 2020); paper Table 3"

    def estimate(self, batch: TokenBatch, full_kl: Tensor | None = None, **_: Any) -> Tensor:
        if full_kl is None or full_kl.shape != batch.mask.shape:
            raise ValueError(f"clipping rule 'full_kl' needs the extra 'full_kl' of shape {tuple(batch.mask.shape)}")
        return torch.where(batch.mask, full_kl.detach().float(), 0.0)
