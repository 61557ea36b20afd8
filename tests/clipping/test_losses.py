"""Aggregation of per-token losses (Dr.GRPO, token mean, sequence mean) and the KL-to-reference regulariser of the
RPG paper: with samples from π_old, w·k is unbiased for KL(π_θ ‖ π_ref) in value and gradient (k1, k3)."""

from __future__ import annotations

import pytest
import torch

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.losses import AGGREGATION_CHOICES, AGGREGATIONS, aggregate, kl_penalty, resolve_aggregation

LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 100.0, 100.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_dr_grpo_divides_by_batch_times_max_completion_length():
    assert aggregate(LOSS, MASK, "dr_grpo", 10).item() == pytest.approx((1 + 2 + 3 + 4 + 5) / (2 * 10))


def test_token_mean_and_seq_mean():
    assert aggregate(LOSS, MASK, "token_mean").item() == pytest.approx(15 / 5)
    assert aggregate(LOSS, MASK, "seq_mean").item() == pytest.approx((6 / 3 + 9 / 2) / 2)


def test_empty_masks_give_zero_not_nan():
    empty = torch.zeros_like(MASK)
    for mode in ("dr_grpo", "token_mean", "seq_mean"):
        assert aggregate(LOSS, empty, mode, 10).item() == 0.0


def test_bad_aggregation_names_the_allowed_values():
    with pytest.raises(ValueError, match="'sum'.*dr_grpo, token_mean, seq_mean"):
        aggregate(LOSS, MASK, "sum")
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate(LOSS, MASK, "dr_grpo", None)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(LOSS, LOSS, MASK, "k4")


def test_estimator_values():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    log_r = ref - logp
    mask = torch.ones_like(logp)
    torch.testing.assert_close(kl_penalty(logp, ref, mask, "k1"), -log_r)
    torch.testing.assert_close(kl_penalty(logp, ref, mask, "k2"), 0.5 * log_r**2)
    torch.testing.assert_close(kl_penalty(logp, ref, mask, "k3"), torch.exp(log_r) - 1 - log_r)
    assert (kl_penalty(logp, ref, torch.zeros_like(mask), "k3") == 0).all()


def exact_expectation(estimator, importance_weight):
    """E_{a∼π_old}[(w·)k(a)] over a 5-action categorical, and its gradient in the logits of π_θ."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(5, generator=g, dtype=torch.float64).requires_grad_()
    old = torch.log_softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)
    ref = torch.log_softmax(torch.randn(5, generator=g, dtype=torch.float64), 0)
    logp = torch.log_softmax(theta, 0)
    weight = torch.exp(logp - old) if importance_weight else None
    per_action = kl_penalty(
        logp[None], ref[None], torch.ones(1, 5), estimator, None if weight is None else weight[None]
    )
    value = (torch.exp(old) * per_action[0]).sum()
    value.backward()
    estimate_grad = theta.grad.clone()
    theta.grad = None
    logp = torch.log_softmax(theta, 0)
    true_kl = (torch.exp(logp) * (logp - ref)).sum()
    true_kl.backward()
    return value.item(), estimate_grad, true_kl.item(), theta.grad


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_importance_weighted_estimators_are_unbiased_off_policy(estimator):
    """RPG: with samples from π_old, E[w·k] = KL(π_θ ‖ π_ref) and its gradient is ∇KL (up to float32 rounding)."""
    value, grad, true_kl, true_grad = exact_expectation(estimator, importance_weight=True)
    assert value == pytest.approx(true_kl, rel=1e-5)
    torch.testing.assert_close(grad, true_grad, rtol=1e-4, atol=1e-6)


def test_without_the_weight_k3_is_biased_off_policy():
    value, grad, true_kl, true_grad = exact_expectation("k3", importance_weight=False)
    assert abs(value - true_kl) > 1e-3 and (grad - true_grad).abs().max() > 1e-3


def test_native_aggregation_resolves_to_the_rules_own():
    """`native` is the rule's declared aggregation (GSPO: seq_mean) or Dr.GRPO for rules without one; an explicit
    choice is kept as it is."""
    for name, rule in RULES.items():
        assert rule.native_aggregation in (None, *AGGREGATIONS), name
        mode, _ = resolve_aggregation("native", build_rule(name))
        assert mode == (rule.native_aggregation or "dr_grpo")
        for choice in AGGREGATIONS:
            assert resolve_aggregation(choice, build_rule(name))[0] == choice
    assert resolve_aggregation("native", build_rule("gspo")) == ("seq_mean", None)


def test_a_sequence_rule_under_a_token_sum_gets_a_one_line_notice():
    """TRL warns that sequence ratios under dr_grpo weight each sequence by its length: so does the resolver,
    for token sums only, and only for rules defined per sequence."""
    for mode in ("dr_grpo", "token_mean"):
        resolved, notice = resolve_aggregation(mode, build_rule("gspo"))
        assert resolved == mode and "\n" not in notice
        assert "'gspo'" in notice and "weighted by its length" in notice and "trainer.loss_agg=native" in notice
    assert resolve_aggregation("seq_mean", build_rule("gspo"))[1] is None
    assert all(resolve_aggregation(mode, build_rule("atr"))[1] is None for mode in AGGREGATION_CHOICES)
    assert all(resolve_aggregation(mode, build_rule("atr_seq"))[1] is None for mode in AGGREGATION_CHOICES)
    with pytest.raises(ValueError, match="aggregation 'sum'; allowed: dr_grpo, token_mean, seq_mean, native"):
        resolve_aggregation("sum", build_rule("atr"))
