"""The cheaper passes of BandPO-KL's root-finder, M2PO, BAPO and the dual clip compute, bit for bit, what their
first implementations computed (tests/helpers/first_implementations.py). BandPO-KL's rule now starts its
root-finder from a table, which changes its floats: tests/clipping/test_kl_band_start.py checks that.

The batches hold the edge cases: ratios exactly at the bounds, masked tokens, zero advantages, tied values.
`torch.equal` counts −0.0 equal to 0.0 (a masked token's loss may be either).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.first_implementations import (
    edge_batch,
    first_bapo_contributions,
    first_dual_clip_loss,
    first_kl_band_root,
    first_largest_until_mean_at_most,
    first_trust_region_tokens,
)

from atr_grpo.clipping import build_rule, make_batch
from atr_grpo.clipping.bandpo import kl_band_root
from atr_grpo.clipping.bapo import contributions
from atr_grpo.clipping.base import ratio_from_log
from atr_grpo.clipping.m2po import largest_until_mean_at_most, trust_region_tokens
from atr_grpo.clipping.ratio import ppo_clip_terms


# ------------------------------------------------------------------------------------------------------ batches
def call_with_grad(rule, logp, old, advantages, mask):
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, old, advantages, mask)
    out.loss.sum().backward()
    return out, leaf.grad


# --------------------------------------------------------------------------------------------------- BandPO-KL
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("delta", [1e-3, 0.05, 1.0, 5.0])
def test_the_in_place_kl_band_root_is_the_first_one_bit_for_bit(dtype, delta):
    """kl_band_root's in-place Newton steps from the closed-form start (`kl_band`, float64) give the first
    implementation's floats, on both sides, for π_old from e^-60 to 1 − 1e-6 and 0 to 4 steps."""
    log_q = torch.linspace(-60.0, math.log1p(-1e-6), 4001, dtype=dtype)
    log_not_q = torch.log1p(-torch.exp(log_q))
    for a, b in ((log_q, log_not_q), (log_not_q, log_q)):
        for steps in range(5):
            assert torch.equal(kl_band_root(a, b, delta, steps), first_kl_band_root(a, b, delta, steps))


@pytest.mark.parametrize("low,high", [(0.8, 1.28), ("tensor", "tensor")])
def test_the_dual_clip_picks_its_bounds_as_torch_where_did(low, high):
    """ppo_clip_terms with dual_c: the bounds picked by a product and a lerp give torch.where's loss and gradient,
    with float and per-token bounds, and with ratios exactly at low, high and c."""
    logp, old, advantages, mask = edge_batch(2)
    g = torch.Generator().manual_seed(5)
    if low == "tensor":
        low, high = torch.rand(old.shape, generator=g), 1 + 2 * torch.rand(old.shape, generator=g)
    at = torch.stack([torch.as_tensor(bound, dtype=torch.float32).expand(old.shape) for bound in (low, high, 3.0)])
    pick = torch.randint(0, 4, old.shape, generator=g)
    on_edge = torch.log(at.gather(0, pick.clamp(max=2)[None])[0])
    logp = torch.where(pick < 3, old + on_edge, logp)
    results = []
    for first in (False, True):
        leaf = logp.clone().requires_grad_()
        batch = make_batch(leaf, old, advantages, mask)
        if first:
            loss = first_dual_clip_loss(batch, ratio_from_log(batch.log_ratio), low, high, 3.0)
        else:
            loss = ppo_clip_terms(batch, low, high, dual_c=3.0).loss
        loss.sum().backward()
        results.append((loss.detach(), leaf.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


# --------------------------------------------------------------------------------------------------------- M2PO
@pytest.mark.parametrize("seed", range(4))
def test_m2pos_selection_is_the_first_one_on_ties_zeros_and_masks(seed):
    """The sort of products (0 for the ineligible) with its values read from the keys takes the same entries as the
    first implementation, with tied values (ties broken by position), eligible zeros, and τ small enough to take
    most entries or large enough to take none."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(16, 200, generator=g).square()
    values[:, ::3] = values[:, 1::3][:, : values[:, ::3].shape[1]]  # ties
    values[:, 5::11] = 0.0
    values[2] = 0.5  # a whole row tied
    eligible = torch.rand(16, 200, generator=g) > 0.4
    for bound in (1e-4, 0.04, 0.3, 10.0):
        chosen = largest_until_mean_at_most(values, eligible, bound)
        assert torch.equal(chosen, first_largest_until_mean_at_most(values, eligible, bound))
    assert largest_until_mean_at_most(values, eligible, 0.04).any()


@pytest.mark.parametrize("scope", ["trust_region", "all"])
def test_m2po_loss_gradient_and_metrics_are_the_first_implementations(scope):
    """Trust-region tokens from signs, and the masked loss as a product: the first implementation's tokens, loss,
    gradient and frozen sets, with zero advantages and log w = 0 exactly."""
    rule = build_rule("m2po", m2_scope=scope)
    logp, old, advantages, mask = edge_batch(3)
    logp[:, ::9] = old[:, ::9]  # log w = 0
    out, grad = call_with_grad(rule, logp, old, advantages, mask)
    batch = make_batch(logp, old, advantages, mask)
    assert torch.equal(trust_region_tokens(batch), first_trust_region_tokens(batch))

    leaf = logp.clone().requires_grad_()
    batch = make_batch(leaf, old, advantages, mask)
    eligible = first_trust_region_tokens(batch) if scope == "trust_region" else batch.mask
    masked = first_largest_until_mean_at_most(batch.log_ratio.detach().square(), eligible, rule.tau_m2)
    ratio = ratio_from_log(batch.log_ratio)
    loss = torch.where(mask, torch.where(masked, 0.0, -ratio * batch.advantages), 0.0)
    loss.sum().backward()
    assert masked.any() and not masked[~mask].any()
    assert torch.equal(out.loss, loss.detach()) and torch.equal(grad, leaf.grad)
    frozen = float((masked & mask).sum() / mask.sum())
    assert out.metrics["clip/frac"] == pytest.approx(frozen, abs=1e-7)
    first_m2 = torch.where(mask, batch.log_ratio.detach().square(), 0.0).sum() / mask.sum().clamp(min=1).float()
    assert out.metrics["m2po/m2"] == float(first_m2)  # a 0-d value now, the same float as the mean over tokens


# --------------------------------------------------------------------------------------------------------- BAPO
def test_bapos_buckets_and_sums_are_the_first_implementations():
    """Buckets picked by lerp, not torch.where: the same buckets and bit-identical float64 sums, with ratios at grid
    points, below and above both grids, zero advantages and masked tokens."""
    rule = build_rule("bapo")
    logp, old, advantages, mask = edge_batch(4, spread=0.8)
    grid_points = torch.tensor([0.6, 0.62, 0.9, 1.2, 1.25, 3.0, 0.1, 20.0]).log()
    logp[:, : len(grid_points)] = old[:, : len(grid_points)] + grid_points
    batch = make_batch(logp, old, advantages, mask)
    low_grid = torch.tensor(rule._low_grid, dtype=torch.float64)
    high_grid = torch.tensor(rule._high_grid, dtype=torch.float64)
    args = (batch, low_grid, rule.c_low_step, high_grid, rule.c_high_step)
    for ours, first in zip(contributions(*args), first_bapo_contributions(*args)):
        assert torch.equal(ours, first)


def test_bapo_logs_its_bounds_and_rho_as_the_batchs_values():
    """BAPO's metrics are its 0-d bounds and ρ as they are (no mean over tokens), and 0 on a batch with no valid
    token, as the mean was."""
    rule = build_rule("bapo")
    logp, old, advantages, mask = edge_batch(5)
    batch = make_batch(logp, old, advantages, mask)
    low, high, rho = rule.balanced_bounds(batch)
    metrics = rule(logp, old, advantages, mask).metrics
    assert metrics["bapo/c_low"] == float(low.float())
    assert metrics["bapo/c_high"] == float(high.float())
    assert metrics["bapo/rho"] == float(rho.float())
    empty = rule(logp, old, advantages, torch.zeros_like(mask)).metrics
    assert empty["bapo/c_low"] == empty["bapo/c_high"] == empty["bapo/rho"] == 0.0
