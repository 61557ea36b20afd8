"""Covariance-based rules of Cui et al. 2025 ("The entropy mechanism of RL for reasoning LMs").

Both rank tokens by Cov_t = (log π_t - mean log π)·(A_t - mean A), the per-token contribution to the
covariance that drives entropy collapse, computed over the valid tokens of the batch passed to the
rule (one micro-batch, as in the public code's per-GPU approximation):

- Clip-Cov detaches a random `max(⌊r·N⌋, 1)` of the tokens with cov_lb < Cov_t < cov_ub that PPO's clip
  has not already frozen (two-sided: whatever the sign of A; even on-policy).
- KL-Cov adds coef·|log w| to the `max(⌊r·N⌋, 1)` tokens of largest Cov_t, with no ratio clip at all
  (its gradient vanishes at w = 1, so it does nothing on-policy).

Selections are pure tensor code (ranks from argsort, quotas as tensors), so they run inside compiled
losses; Clip-Cov's randomness is a hash of a seed (drawn from a `torch.Generator` when called) and of each
token's index among the valid tokens (`hashed_uniform`), so the TRL and Unsloth paths select the same tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.base import (
    ClipOutput,
    ClipRule,
    RuleTerms,
    TokenBatch,
    number,
    positive,
    ratio_from_log,
    register,
)
from atr_grpo.clipping.ratio import ClipRangeRule, ppo_clip_terms


def token_covariance(batch: TokenBatch) -> Tensor:
    """`[B, T]` centred cross-products over valid tokens (0 elsewhere), without gradient."""
    valid = batch.mask
    count = valid.sum().clamp(min=1)
    logp = batch.logp.detach()
    mean_logp = (logp * valid).sum() / count
    mean_adv = (batch.advantages * valid).sum() / count
    return torch.where(valid, (logp - mean_logp) * (batch.advantages - mean_adv), 0.0)


def lowest_ranked(keys: Tensor, eligible: Tensor, quota: Tensor) -> Tensor:
    """Boolean `[B, T]`: the `quota` eligible entries with the smallest keys (ties by position)."""
    flat = torch.where(eligible, keys, torch.inf).flatten()
    rank = torch.argsort(torch.argsort(flat, stable=True), stable=True)  # position of each entry in sorted order
    return eligible & (rank.view_as(keys) < quota)


_MASK32 = 0xFFFFFFFF


def hashed_uniform(seed: Tensor, mask: Tensor) -> Tensor:
    """`[B, T]` pseudo-random numbers in [0, 1) from (seed, row, index of the token among its row's valid tokens).

    A counter-based hash (murmur3's 32-bit finaliser) instead of a random-number generator: pure integer
    tensor ops, so it runs inside torch.compile, and keyed by each token's position among the valid tokens,
    so it is the same whether a batch is left- or right-padded (Unsloth repacks padding before its loss).
    """
    valid_index = torch.cumsum(mask.long(), dim=1) - 1
    row = torch.arange(mask.shape[0], device=mask.device).unsqueeze(1)
    x = (seed.long() * 0x9E3779B1 + row * 0x85EBCA77 + valid_index * 0xC2B2AE3D) & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    x = x ^ (x >> 16)
    return x.double() / 2.0**32


def key_seed_from(generator: torch.Generator) -> Tensor:
    """The 0-d seed of `hashed_uniform`, drawn from a generator (how a seeded call becomes a tensor input)."""
    return torch.randint(0, 2**31 - 1, (), generator=generator, device=generator.device)


def token_quota(batch: TokenBatch, fraction: float) -> Tensor:
    """max(⌊fraction · N⌋, 1) as a tensor, N = number of valid tokens."""
    return torch.clamp(torch.floor(fraction * batch.mask.sum()), min=1)


@register
class ClipCov(ClipRangeRule):
    """PPO clip plus random detachment of covariance-selected tokens.

    The clip band defaults to 1.0/1.0: the Clip-Cov recipe loosens PPO's clip to 1 so that it only
    filters extreme tokens and the covariance selection does the work; (0.2, 0.28) is one override away.
    """

    name = "clip_cov"
    family = "covariance"
    acts_on_policy = True  # the covariance selection is detached whatever w is
    needs = ("generator",)  # or `key_seed` / `random_keys` directly (see check_extras)
    params = (
        number("eps_low", 1.0, "a number in (0, 1]", lambda v: 0 < v <= 1, "lower clip range (recipe 1.0)"),
        positive("eps_high", 1.0, "upper clip range (recipe 1.0)"),
        number("ratio", 2e-4, "a number in (0, 1]", lambda v: 0 < v <= 1, "fraction r of tokens to detach"),
        number("cov_lb", 1.0, "a finite number", lambda v: True, "lower covariance bound ω_low"),
        number("cov_ub", 5.0, "a finite number", lambda v: True, "upper covariance bound ω_high"),
    )
    summary = "clip, plus detaching a random fraction r of the tokens whose covariance lies in (cov_lb, cov_ub)"
    source = "Clip-Cov (Cui et al. 2025)"

    def validate(self) -> None:
        if not self.cov_ub > self.cov_lb:
            raise ValueError(
                f"clipping rule 'clip_cov': parameter 'cov_ub' must be > cov_lb = {self.cov_lb}, got {self.cov_ub}"
            )

    def check_extras(self, extras: dict[str, Any]) -> None:
        if all(extras.get(k) is None for k in ("generator", "key_seed", "random_keys")):
            raise ValueError(
                "clipping rule 'clip_cov' needs the extra 'generator' (a torch.Generator), 'key_seed' or 'random_keys'"
            )

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, **extras: Any) -> ClipOutput:
        generator = extras.pop("generator", None)
        if generator is not None and extras.get("random_keys") is None and extras.get("key_seed") is None:
            extras["key_seed"] = key_seed_from(generator)
        return super().__call__(logp, old_logp, advantages, mask, **extras)

    def terms(
        self, batch: TokenBatch, random_keys: Tensor | None = None, key_seed: Tensor | None = None, **_: Any
    ) -> RuleTerms:
        if random_keys is None:
            random_keys = hashed_uniform(key_seed.to(batch.mask.device), batch.mask)
        clipped = ppo_clip_terms(batch, 1 - self.eps_low, 1 + self.eps_high)
        cov = token_covariance(batch)
        ppo_frozen = clipped.frozen_low | clipped.frozen_high
        candidates = batch.mask & ~ppo_frozen & (cov > self.cov_lb) & (cov < self.cov_ub)
        detached = lowest_ranked(random_keys, candidates, token_quota(batch, self.ratio))
        return RuleTerms(
            loss=torch.where(detached, 0.0, clipped.loss),
            frozen_low=clipped.frozen_low,
            frozen_high=clipped.frozen_high,
            frozen_other=detached,
            extra={"clip/frac_cov": detached},
        )


@register
class KLCov(ClipRule):
    """No ratio clip; a coef·|log w| penalty on the top-r tokens by covariance."""

    name = "kl_cov"
    family = "covariance"
    params = (
        number("ratio", 2e-3, "a number in (0, 1]", lambda v: 0 < v <= 1, "fraction k of tokens (7B recipe 0.2%)"),
        positive("coef", 1.0, "penalty coefficient β (recipe 1)"),
    )
    summary = "−w·A, plus coef·|log w| on the top-r tokens by covariance"
    source = "KL-Cov (Cui et al. 2025)"

    def terms(self, batch: TokenBatch, **_: Any) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        cov = token_covariance(batch)
        selected = lowest_ranked(-cov, batch.mask, token_quota(batch, self.ratio))
        penalty = torch.where(selected, self.coef * batch.log_ratio.abs(), 0.0)
        never = torch.zeros_like(batch.mask)
        return RuleTerms(
            loss=-ratio * batch.advantages + penalty,
            frozen_low=never,
            frozen_high=never,
            extra={"clip/frac_kl_penalty": selected},
        )
