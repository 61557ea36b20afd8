"""verl's actor loss through the plugin equals our rule + our aggregation, in value and in gradient.

The verl side is `verl.workers.utils.losses.ppo_loss`, what verl's actor workers call: loss selection from the
config, global batch sizes, the plugin's loss, verl's `agg_loss`. `atr_grpo.integrations.verl_check` prints the
same comparison as a table.
"""

import pytest
import torch

from atr_grpo.clipping import RULES, build_rule, rule_at_defaults
from atr_grpo.integrations import verl as plugin
from atr_grpo.integrations import verl_check
from atr_grpo.losses import aggregate

pytest.importorskip("verl", reason="needs verl: run make test-verl")

MODES = list(plugin.VERL_AGGREGATIONS)


@pytest.mark.filterwarnings("ignore:clipping rule .* is defined per sequence")  # GSPO, GMPO under a token sum
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rule_name", sorted(RULES))
def test_every_rule_equals_ours_under_every_mapped_mode(rule_name, mode):
    """For every rule of the registry (refused ones excepted): same loss, same gradient, and neither is zero."""
    if plugin.refusal(RULES[rule_name]):
        with pytest.raises(ValueError, match="is not available under verl"):
            verl_check.gaps(rule_name, mode)
        return
    gap = verl_check.gaps(rule_name, mode)
    assert gap.loss_scale > 1e-4 and gap.grad_scale > 1e-5
    assert gap.within_tolerance(), gap


def test_the_comparison_sees_a_different_delta():
    """The check can fail: verl at δ = 0.05 against ours at the default δ = 0.07 differ well beyond tolerance."""
    inputs = verl_check.random_inputs()
    length = inputs.mask.shape[1]
    config = verl_check.actor_config("atr_grpo.atr", "token-mean", length, delta=0.05)
    verl_loss, _ = verl_check.verl_actor_loss(config, inputs)
    ours_at_default = verl_check.reference_loss(rule_at_defaults("atr"), "token-mean", inputs, {})
    assert (verl_loss - ours_at_default).abs().item() > 1e-4


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_add_up_to_the_mini_batch(mode):
    """With verl's global token and sequence counts, two micro-batches sum to our loss on the whole batch."""
    inputs = verl_check.random_inputs(seed=1)
    batch, length = inputs.mask.shape
    config = verl_check.actor_config("atr_grpo.atr", mode, length)
    total = 0.0
    for rows in (slice(0, batch // 2), slice(batch // 2, batch)):
        part = verl_check.TokenInputs(
            inputs.logp[rows], inputs.old_logp[rows], inputs.advantages[rows], inputs.mask[rows]
        )
        loss, _ = verl_check.verl_actor_loss(config, part, global_tokens=int(inputs.mask.sum()), global_sequences=batch)
        total = total + loss
    (verl_grad,) = torch.autograd.grad(total, inputs.logp)
    ours = verl_check.reference_loss(rule_at_defaults("atr"), mode, inputs, {})
    (our_grad,) = torch.autograd.grad(ours, inputs.logp)
    torch.testing.assert_close(total, ours, rtol=0, atol=verl_check.LOSS_TOLERANCE)
    torch.testing.assert_close(verl_grad, our_grad, rtol=0, atol=verl_check.GRAD_TOLERANCE)


def test_rollout_correction_weights_multiply_the_per_token_loss():
    """verl's rollout-correction weights scale each token's loss before aggregation, as verl's own losses do."""
    inputs = verl_check.random_inputs(seed=2)
    length = inputs.mask.shape[1]
    weights = 0.5 + torch.rand(inputs.mask.shape, generator=torch.Generator().manual_seed(3))
    config = verl_check.actor_config("atr_grpo.atr", "token-mean", length)
    verl_loss, _ = verl_check.verl_actor_loss(config, inputs, rollout_is_weights=weights)
    out = build_rule("atr")(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask)
    ours = aggregate(out.loss * weights, inputs.mask, "token_mean")
    torch.testing.assert_close(verl_loss, ours, rtol=0, atol=verl_check.LOSS_TOLERANCE)
    unweighted, _ = verl_check.verl_actor_loss(config, inputs)
    assert (unweighted - verl_loss).abs().item() > 1e-4


def test_metrics_are_the_rule_metrics_under_actor():
    """The rule's metric keys reach verl's metrics under `actor/` with the rule's values."""
    inputs = verl_check.random_inputs()
    config = verl_check.actor_config("atr_grpo.atr", "token-mean", inputs.mask.shape[1])
    _, metrics = verl_check.verl_actor_loss(config, inputs)
    expected = build_rule("atr")(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask).metrics
    for key, value in expected.items():
        assert metrics[f"actor/{key}"].aggregate() == pytest.approx(value)
    assert 0 < expected["clip/frac"] < 1  # the batch makes ATR clip some tokens and keep others


# ---- against verl's own implementations of the same objectives (independent code) ----
def verl_builtin(loss_mode, mode, inputs, actor=None, **policy_loss):
    """verl's built-in loss `loss_mode` through the same actor path (plain verl config fields)."""
    from verl.workers.config import ActorConfig, PolicyLossConfig

    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=mode,
        loss_scale_factor=inputs.mask.shape[1],
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy_loss),
        **(actor or {}),
    )
    loss, _ = verl_check.verl_actor_loss(config, inputs)
    return loss, torch.autograd.grad(loss, inputs.logp)[0]


def plugin_loss(rule_loss_mode, mode, inputs, **params):
    config = verl_check.actor_config(rule_loss_mode, mode, inputs.mask.shape[1], **params)
    loss, _ = verl_check.verl_actor_loss(config, inputs)
    return loss, torch.autograd.grad(loss, inputs.logp)[0]


def assert_same(first, second):
    torch.testing.assert_close(first[0], second[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(first[1], second[1], rtol=1e-6, atol=1e-8)


def bound_counts(inputs, low, high, c=None):
    """Valid tokens beyond each bound on the side their advantage pushes (what a clip can act on)."""
    ratio = (inputs.logp - inputs.old_logp).exp()
    positive = inputs.mask & (inputs.advantages > 0)
    negative = inputs.mask & (inputs.advantages < 0)
    counts = [int((positive & (ratio > high)).sum()), int((negative & (ratio < low)).sum())]
    return counts + ([int((negative & (ratio > c)).sum())] if c is not None else [])


@pytest.mark.parametrize("mode", MODES)
def test_dual_clip_equals_verl_vanilla(mode):
    """Our dual_clip(ε_low, ε_high, c) is verl's default `vanilla` loss with the same three numbers."""
    inputs = verl_check.random_inputs(seed=4)
    assert min(bound_counts(inputs, 0.8, 1.28, c=1.5)) >= 5  # every bound binds on some tokens
    ours = plugin_loss("atr_grpo.dual_clip", mode, inputs, eps_low=0.2, eps_high=0.28, c=1.5)
    clip_ratios = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 1.5}
    assert_same(ours, verl_builtin("vanilla", mode, inputs, clip_ratios))


@pytest.mark.parametrize("mode", MODES)
def test_clip_higher_equals_verl_vanilla_without_the_dual_floor(mode):
    """Clip-Higher is `vanilla` with the dual-clip floor out of reach (c beyond any ratio)."""
    inputs = verl_check.random_inputs(seed=5)
    assert min(bound_counts(inputs, 0.8, 1.28)) >= 5
    ours = plugin_loss("atr_grpo.clip_higher", mode, inputs, eps_low=0.2, eps_high=0.28)
    clip_ratios = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 1e9}
    assert_same(ours, verl_builtin("vanilla", mode, inputs, clip_ratios))


def test_sapo_equals_verl_sapo():
    """SAPO's gate with τ_pos/τ_neg equals verl's `sapo` (which always aggregates seq-mean-token-mean)."""
    inputs = verl_check.random_inputs(seed=6)
    ours = plugin_loss("atr_grpo.sapo", "seq-mean-token-mean", inputs, tau_pos=1.0, tau_neg=1.5)
    theirs = verl_builtin("sapo", "seq-mean-token-mean", inputs, {"tau_pos": 1.0, "tau_neg": 1.5})
    assert_same(ours, theirs)


def test_kl_cov_equals_verl_kl_cov():
    """KL-Cov (top-k tokens by covariance get coef·|log w|) equals verl's `kl_cov` at the same k and coef."""
    inputs = verl_check.random_inputs(seed=7)
    ours = plugin_loss("atr_grpo.kl_cov", "token-mean", inputs, ratio=0.05, coef=1.0)
    theirs = verl_builtin("kl_cov", "token-mean", inputs, kl_cov_ratio=0.05, ppo_kl_coef=1.0)
    assert_same(ours, theirs)
