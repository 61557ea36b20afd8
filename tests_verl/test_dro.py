"""DRO against verl 0.9.1's own `dro` policy loss (`compute_policy_loss_dro`), through the actor loss verl's workers
call, in loss and gradient, under every `loss_agg_mode` that has a counterpart here.

Convention difference: verl's β is `policy_loss.dro_beta`, a field of verl's `PolicyLossConfig`, so a rule
parameter may not take that name (`atr_grpo/clipping/param_names.py`); ours is `beta`, and `atr_grpo.dro` reads
`policy_loss.beta`. verl has no default β; the rule's 0.05 is verl's own usage example.
"""

import pytest
import torch

from atr_grpo.clipping import build_rule
from atr_grpo.integrations import verl as plugin
from atr_grpo.integrations import verl_check

pytest.importorskip("verl", reason="needs verl: run make test-verl")


def verl_dro(mode, inputs, beta):
    """verl's built-in `dro` (plain verl config: `loss_mode=dro`, `dro_beta=β`): its loss and gradient."""
    from verl.workers.config import ActorConfig, PolicyLossConfig

    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=mode,
        loss_scale_factor=inputs.mask.shape[1],
        policy_loss=PolicyLossConfig(loss_mode="dro", dro_beta=beta),
    )
    loss, _ = verl_check.verl_actor_loss(config, inputs)
    return loss, torch.autograd.grad(loss, inputs.logp)[0]


def plugin_dro(mode, inputs, **params):
    """`atr_grpo.dro` through the plugin, on the same verl path."""
    config = verl_check.actor_config("atr_grpo.dro", mode, inputs.mask.shape[1], **params)
    loss, metrics = verl_check.verl_actor_loss(config, inputs)
    return loss, torch.autograd.grad(loss, inputs.logp)[0], metrics


@pytest.mark.parametrize("mode", list(plugin.VERL_AGGREGATIONS))
@pytest.mark.parametrize("beta", [0.05, 0.7])
def test_dro_equals_verl_dro(mode, beta):
    """Our `beta` is verl's `dro_beta`: same loss, same gradient; the penalty's share of the gradient is not
    negligible at the larger β (so a wrong β or sign would show)."""
    inputs = verl_check.random_inputs(seed=11)
    loss, grad, _ = plugin_dro(mode, inputs, beta=beta)
    theirs = verl_dro(mode, inputs, beta)
    torch.testing.assert_close(loss, theirs[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, theirs[1], rtol=1e-6, atol=1e-8)
    other, _ = verl_dro(mode, inputs, beta * 2)
    assert (other - theirs[0]).abs() > 1e-5


def test_dro_default_and_metrics_under_verl():
    """Without `policy_loss.beta` the plugin uses the rule's default (0.05); `actor/dro/penalty` is the rule's."""
    inputs = verl_check.random_inputs(seed=12)
    loss, grad, metrics = plugin_dro("token-mean", inputs)
    theirs = verl_dro("token-mean", inputs, 0.05)
    torch.testing.assert_close(loss, theirs[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, theirs[1], rtol=1e-6, atol=1e-8)
    expected = build_rule("dro")(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask).metrics
    assert metrics["actor/dro/penalty"].aggregate() == pytest.approx(expected["dro/penalty"])
    assert expected["dro/penalty"] > 0 and expected["clip/frac"] == 0
