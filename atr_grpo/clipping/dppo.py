"""DPPO (Qi et al. 2026, arXiv 2602.04879): a trust region on the probabilities, not on the ratio.

DPPO-Binary keeps a token's update while a binary divergence between π_old(y_t) = q and π_θ(y_t) = p stays
below δ on the side its advantage pushes, and trains it with a truncated-IS REINFORCE loss (verl's `dppo_tv`
and `dppo_kl`, from the authors, read in verl 0.9.1 `core_algos.py`):

    loss_t = −A_t · sg(min(w_t, c)) · log π_θ(y_t) · v_t
    dppo_tv:  v_t = [p − q ≤ δ_high] if A_t > 0,   [p − q ≥ −δ_low] otherwise        (total variation)
    dppo_kl:  v_t = [KL_b ≤ δ_high or p ≤ q] if A_t > 0,   [KL_b ≤ δ_low or p ≥ q] otherwise
              KL_b = q·log(q/p) + (1 − q)·log((1 − q + 1e-8)/(1 − p + 1e-8))     (Bernoulli KL, verl's form)

A token outside has loss 0 (verl multiplies by v_t). The region depends on q: with δ 0.05, dppo_kl lets a token
with q = 0.01 rise to w ≈ 7.8 where ATR (δ 0.07) allows w ∈ [0.671, 1.422], and holds a token with q = 0.9 to
w ≤ 1.08 (`old_prob_bounds`). Defaults are the authors' recipe (verl `examples/dppo_trainer`): δ = 0.15 (TV) and
0.05 (KL) on both sides, and c = 1e4, i.e. no truncation in practice: the paper finds that truncating the IS
weight biases against rare tokens (verl's code falls back to c = 20, its actor config to 3). Probabilities are
exp(log-prob) with log-probs capped at 0, so impossible inputs (p > 1) never give NaN.
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
    ratio_from_log,
    register,
)

BINARY_KL_SMOOTHING = 1e-8  # verl's, inside the log of the "every other token" term
_LOG_RANGE = 700.0  # the lower bounds are searched down to π_θ = π_old·e^-700 (float64 still represents it)


def binary_kl(old_logp: Tensor, logp: Tensor) -> Tensor:
    """KL(Bern(q) ‖ Bern(p)) with q = exp(old_logp), p = exp(logp), as verl computes it."""
    old_prob, prob = torch.exp(old_logp), torch.exp(logp)
    rest = torch.log((1 - old_prob + BINARY_KL_SMOOTHING) / (1 - prob + BINARY_KL_SMOOTHING))
    return old_prob * (old_logp - logp) + (1 - old_prob) * rest


def outside_on_the_pushed_side(divergence: Tensor, change: Tensor, positive: Tensor, threshold: Any) -> Tensor:
    """DPPO's test written once for any divergence: a token is dropped when its divergence exceeds `threshold` and
    its probability moved (`change` = π_θ − π_old) the way its advantage pushes. For the binary TV (divergence
    |change|) it is `dppo_tv`'s signed test, for the Bernoulli KL `dppo_kl`'s."""
    pushed = torch.where(positive, change > 0, change < 0)
    return (divergence > threshold) & pushed


def _boundary(inside: Any, start: Tensor, end: Tensor, iterations: int = 90) -> Tensor:
    """Bisection between `start` (inside) and `end` (outside), elementwise; `end` itself where it is inside."""
    end_inside = inside(end)
    for _ in range(iterations):
        middle = 0.5 * (start + end)
        ok = inside(middle)
        start, end = torch.where(ok, middle, start), torch.where(ok, end, middle)
    return torch.where(end_inside, end, start)


class _DPPO(ClipRule):
    """DPPO-Binary: the loss above with a rule-specific `valid` test and per-π_old ratio bounds."""

    family = "divergence"

    def valid(self, old_logp: Tensor, logp: Tensor, positive: Tensor) -> Tensor:
        raise NotImplementedError

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio).detach()
        adv = batch.advantages
        with torch.no_grad():
            logp = batch.logp.detach().clamp(max=0.0)
            valid = self.valid(batch.old_logp.clamp(max=0.0), logp, adv > 0)
        loss = torch.where(valid, -adv * ratio.clamp(max=self.c) * batch.logp, 0.0)
        frozen = ~valid & (adv != 0)
        return RuleTerms(
            loss=loss,
            frozen_low=frozen & (adv < 0),
            frozen_high=frozen & (adv > 0),
            extra={"clip/frac_truncated": valid & (ratio > self.c)},
        )

    def old_prob_bounds(self, old_prob: Tensor) -> tuple[Tensor, Tensor]:
        """(lowest w for A < 0, highest w for A > 0) inside the region at π_old = `old_prob` (w ≤ 1/π_old), found
        by bisection on log π_θ (relative precision even for the tiny lower bounds of rare tokens)."""
        old_logp = torch.log(old_prob)
        rising, falling = torch.ones_like(old_prob, dtype=torch.bool), torch.zeros_like(old_prob, dtype=torch.bool)
        high = _boundary(lambda logp: self.valid(old_logp, logp, rising), old_logp, torch.zeros_like(old_logp))
        low = _boundary(lambda logp: self.valid(old_logp, logp, falling), old_logp, old_logp - _LOG_RANGE)
        reaches_zero = self.valid(old_logp, old_logp - _LOG_RANGE, falling)
        return torch.where(reaches_zero, 0.0, torch.exp(low - old_logp)), torch.exp(high - old_logp)


def _dppo_params(delta: float) -> tuple[Param, ...]:
    source = "DPPO recipe"
    return (
        open_unit("delta_low", delta, f"threshold on the side A < 0 pushes ({source}: {delta:g})"),
        open_unit("delta_high", delta, f"threshold on the side A > 0 pushes ({source}: {delta:g})"),
        number("c", 1e4, "a number ≥ 1", lambda v: v >= 1, "IS-weight truncation min(w, c) (DPPO recipe: 1e4)"),
    )


@register
class DPPOTV(_DPPO):
    """DPPO-Binary-TV: |π_θ(y_t) − π_old(y_t)| ≤ δ on the side the advantage pushes."""

    name = "dppo_tv"
    params = _dppo_params(0.15)
    summary = "−A·sg(min(w, c))·log π while π_θ − π_old ≤ δ_high (A > 0) / ≥ −δ_low (A < 0), else 0"
    source = "DPPO-Binary-TV (Qi et al. 2026); verl `dppo_tv`"

    def valid(self, old_logp: Tensor, logp: Tensor, positive: Tensor) -> Tensor:
        change = torch.exp(logp) - torch.exp(old_logp)
        return torch.where(positive, change <= self.delta_high, change >= -self.delta_low)


@register
class DPPOKL(_DPPO):
    """DPPO-Binary-KL: the Bernoulli KL between π_old(y_t) and π_θ(y_t) ≤ δ on the side the advantage pushes."""

    name = "dppo_kl"
    params = _dppo_params(0.05)
    summary = "−A·sg(min(w, c))·log π while KL(Bern(π_old) ‖ Bern(π_θ)) ≤ δ on the side A pushes, else 0"
    source = "DPPO-Binary-KL (Qi et al. 2026); verl `dppo_kl`"

    def valid(self, old_logp: Tensor, logp: Tensor, positive: Tensor) -> Tensor:
        divergence = binary_kl(old_logp, logp)
        prob, old_prob = torch.exp(logp), torch.exp(old_logp)
        return torch.where(
            positive,
            (divergence <= self.delta_high) | (prob <= old_prob),
            (divergence <= self.delta_low) | (prob >= old_prob),
        )
