"""BandPO-KL's rule finds its bounds with one Newton step from a table of the root (`kl_start_table`), where it took
three from the closed-form start: it converges at least as far, and its float32 bounds, loss and gradient are the
first implementation's up to float32's own error, which both share."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.first_implementations import edge_batch, first_dual_clip_loss, first_kl_band_root, first_kl_side_bound

from atr_grpo.clipping import build_rule, make_batch
from atr_grpo.clipping.bandpo import kl_band, kl_band_root, kl_start_table
from atr_grpo.clipping.base import ratio_from_log

DELTAS = (1e-3, 1e-2, 0.05, 0.2, 1.0, 5.0)


def relative_error(value, reference):
    """The largest |value − reference| / reference, absolute where the reference is below 1e-6."""
    return float(((value - reference).abs() / reference.clamp(min=1e-6)).max())


def both_sides(log_q):
    """(log q, log(1 − q)) for the upper root and the same pair swapped for the lower one."""
    log_not_q = torch.log1p(-torch.exp(log_q))
    return ((log_q, log_not_q), (log_not_q, log_q))


@pytest.mark.parametrize("delta", DELTAS)
def test_one_step_from_the_table_converges_further_than_three_from_the_closed_form_start(delta):
    """In float64, for π_old from e^-60 to 1 − 1e-6 on both sides: the table alone is within 2e-5 of the root, one
    Newton step from it within 1e-9, and never further than three steps from the closed-form start (≤ 5e-8)."""
    table = kl_start_table(delta)
    log_q = torch.linspace(-60.0, math.log1p(-1e-6), 20001, dtype=torch.float64)
    for own, other in both_sides(log_q):
        root = kl_band_root(own, other, delta, steps=8)
        first = relative_error(first_kl_band_root(own, other, delta, steps=3), root)
        assert relative_error(kl_band_root(own, other, delta, steps=0, start_table=table), root) < 2e-5
        ours = relative_error(kl_band_root(own, other, delta, steps=1, start_table=table), root)
        assert ours <= min(1e-9, max(first, 1e-15))
        assert first < 5e-8


@pytest.mark.parametrize("delta", [1e-3, 0.05, 0.3, 5.0])
@pytest.mark.parametrize("rising", [True, False])
def test_the_float32_bounds_are_as_close_to_float64_as_the_first_ones(delta, rising):
    """The rule's float32 bound on each side, for π_old from e^-60 to 1 − 1e-7, against the float64 band: its
    largest relative error (below 1e-6, absolute) is at most 1.25 times the first implementation's. The two agree
    to 1e-5 where δ ≥ 0.05; at δ = 1e-3 the lower bound's float32 error is 4e-4 in both, and so is their gap."""
    rule = build_rule("bandpo_kl", delta=delta, ratio_cap=1e30)
    old_logp = torch.linspace(-60.0, -1e-7, 200001)
    side = torch.full_like(old_logp, rising, dtype=torch.bool)
    low, high = kl_band(old_logp.double(), delta)
    truth = high if rising else low
    ours = rule.side_bound(old_logp, side).double()
    first = first_kl_side_bound(old_logp, side, delta).double()

    assert relative_error(ours, truth) <= 1.25 * relative_error(first, truth) + 1e-7
    assert relative_error(ours, first) <= (1e-5 if delta >= 0.05 else 4e-4)


@pytest.mark.parametrize("delta", [0.02, 0.05, 0.3])
def test_bandpo_kls_loss_and_gradient_are_the_first_implementations_up_to_float32(delta):
    """On a batch with masked tokens, zero advantages and π_old from 1e-12 to 1: the rule's loss is the first
    implementation's to 1e-5, and its gradient is the same float wherever the ratio is not within 1e-4 of a bound
    (there a last-bit difference in the bound may freeze a token or not)."""
    rule = build_rule("bandpo_kl", delta=delta)
    logp, old, advantages, mask = edge_batch(1)
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, old, advantages, mask)
    out.loss.sum().backward()

    first_leaf = logp.clone().requires_grad_()
    batch = make_batch(first_leaf, old, advantages, mask)
    bound = first_kl_side_bound(batch.old_logp, batch.advantages > 0, delta)
    ratio = ratio_from_log(batch.log_ratio)
    first = torch.where(mask, first_dual_clip_loss(batch, ratio, bound, bound.clamp(max=rule.ratio_cap), rule.c), 0.0)
    first.sum().backward()

    torch.testing.assert_close(out.loss, first.detach(), rtol=1e-5, atol=1e-7)
    near = ((ratio.detach() - bound).abs() <= 1e-4 * bound) | ((ratio.detach() - rule.ratio_cap).abs() <= 1e-3)
    assert torch.equal(leaf.grad[~near], first_leaf.grad[~near])
    assert (~near & mask).sum() > 0.9 * mask.sum()
