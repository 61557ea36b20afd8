"""Rollout rejection (`rollout.rejection`) equals verl 0.9.1's sequence rejection (`rollout_corr_helper`'s
`compute_rollout_correction_and_rejection_mask` with `rollout_rs`): the same sequences kept, the same IS weights when
chained with tis/mis, the same rejected share, and through verl's actor the same loss and gradient."""

import pytest
import torch

from atr_grpo.clipping import build_rule
from atr_grpo.integrations import verl as plugin
from atr_grpo.integrations import verl_check
from atr_grpo.losses import LossSettings, grpo_loss
from atr_grpo.rollout_correction import REJECTIONS, RolloutCorrection

pytest.importorskip("verl", reason="needs verl: run make test-verl")

# verl's rollout_is and rollout_is_threshold, and the same weight here: (kind, level, C_min, C_max)
WEIGHTS = {
    "no weight": (None, 2.0, ("none", "token", None, 2.0)),
    "tis token": ("token", 2.0, ("tis", "token", None, 2.0)),
    "tis sequence": ("sequence", 2.0, ("tis", "sequence", None, 2.0)),
    "mis token (IcePop)": ("token", "0.5_2.0", ("mis", "token", 0.5, 2.0)),
}


def engine_inputs(seed):
    """verl_check's policy-loss batch, and the engine's log-probs off π_old's by N(0, 0.25²) per token."""
    inputs = verl_check.random_inputs(seed=seed)
    noise = torch.randn(inputs.old_logp.shape, generator=torch.Generator().manual_seed(seed + 100))
    return inputs, inputs.old_logp + 0.25 * noise


def verl_correction(inputs, rollout_logp, rollout_is, is_threshold, rejection, threshold):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    weights, kept_mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=inputs.old_logp,
        rollout_log_prob=rollout_logp,
        response_mask=inputs.mask.long(),
        rollout_is=rollout_is,
        rollout_is_threshold=is_threshold,
        rollout_rs=rejection,
        rollout_rs_threshold=threshold,
    )
    return (None if weights is None else weights.batch["rollout_is_weights"]), kept_mask.bool(), metrics


def splitting_threshold(inputs, rollout_logp, rejection):
    """A threshold at which verl rejects some sequences and keeps others (so that the comparison can fail)."""
    for threshold in (1e-3, 3e-3, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0):
        _, _, metrics = verl_correction(inputs, rollout_logp, None, 2.0, rejection, threshold)
        if 0.2 <= metrics["rollout_corr/rollout_rs_seq_masked_fraction"] <= 0.8:
            return threshold
    raise AssertionError(f"no threshold splits the batch for {rejection}")


@pytest.mark.parametrize("weighting", WEIGHTS)
@pytest.mark.parametrize("rejection", REJECTIONS[1:])
def test_rejection_keeps_what_verl_keeps_and_weighs_what_verl_weighs(rejection, weighting):
    inputs, rollout_logp = engine_inputs(seed=0)
    threshold = splitting_threshold(inputs, rollout_logp, rejection)
    rollout_is, is_threshold, ours = WEIGHTS[weighting]
    verl_weights, verl_kept, metrics = verl_correction(
        inputs, rollout_logp, rollout_is, is_threshold, rejection, threshold
    )
    correction = RolloutCorrection(*ours, rejection, threshold)
    kept = inputs.mask & correction.kept(inputs.old_logp, rollout_logp, inputs.mask)
    assert torch.equal(kept, verl_kept)
    assert kept.any(dim=1).sum() < inputs.mask.any(dim=1).sum(), "some sequence is rejected"
    share = correction.metrics(inputs.old_logp, rollout_logp, inputs.mask)["rollout/rejected_frac"]
    assert share == pytest.approx(metrics["rollout_corr/rollout_rs_masked_fraction"], abs=1e-6)
    if verl_weights is not None:
        weight = correction.weight(inputs.old_logp, rollout_logp, inputs.mask).expand_as(inputs.old_logp)
        torch.testing.assert_close(weight * inputs.mask, verl_weights * inputs.mask, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", list(plugin.VERL_AGGREGATIONS))
@pytest.mark.parametrize("weighting", ["no weight", "tis sequence", "mis token (IcePop)"])
def test_the_loss_with_a_rejection_is_verls_actor_loss_on_verls_rejected_batch(weighting, mode):
    """verl rejects in the trainer (response_mask) and hands its actor the IS weights; our one loss composition
    gives the same loss and gradient, normalisers included (verl's global sequence count is the batch's)."""
    inputs, rollout_logp = engine_inputs(seed=1)
    rejection = "seq_max_k3"
    threshold = splitting_threshold(inputs, rollout_logp, rejection)
    rollout_is, is_threshold, ours = WEIGHTS[weighting]
    verl_weights, verl_kept, _ = verl_correction(inputs, rollout_logp, rollout_is, is_threshold, rejection, threshold)
    length = inputs.mask.shape[1]
    config = verl_check.actor_config("atr_grpo.atr", mode, length)
    rejected_batch = verl_check.TokenInputs(inputs.logp, inputs.old_logp, inputs.advantages, verl_kept)
    verl_loss, _ = verl_check.verl_actor_loss(config, rejected_batch, rollout_is_weights=verl_weights)
    (verl_grad,) = torch.autograd.grad(verl_loss, inputs.logp)
    settings = LossSettings(
        loss_agg=plugin.VERL_AGGREGATIONS[mode],
        max_completion_length=length,
        correction=RolloutCorrection(*ours, rejection, threshold),
    )
    result = grpo_loss(
        build_rule("atr"),
        inputs.logp,
        inputs.old_logp,
        inputs.advantages,
        inputs.mask,
        settings,
        sampling_logp=rollout_logp,
    )
    (our_grad,) = torch.autograd.grad(result.loss, inputs.logp)
    torch.testing.assert_close(result.loss, verl_loss, rtol=0, atol=verl_check.LOSS_TOLERANCE)
    torch.testing.assert_close(our_grad, verl_grad, rtol=0, atol=verl_check.GRAD_TOLERANCE)
    unrejected, _ = verl_check.verl_actor_loss(config, inputs, rollout_is_weights=verl_weights)
    assert (unrejected - verl_loss).abs().item() > 1e-4, "the rejection changes verl's loss"
