"""The loss is chosen, and its parameters set and validated, through verl's own Hydra config (`ppo_trainer`)."""

import pickle
import warnings

import pytest
import torch

from atr_grpo.clipping import build_rule, rule_at_defaults
from atr_grpo.clipping.extras import key_seed_from
from atr_grpo.integrations import verl as plugin
from atr_grpo.integrations import verl_check
from atr_grpo.losses import aggregate

pytest.importorskip("verl", reason="needs verl: run make test-verl")

ACTOR = "actor_rollout_ref.actor"
BASE = [
    f"{ACTOR}.policy_loss._target_={plugin.CONFIG_TARGET}",
    f"{ACTOR}.ppo_micro_batch_size_per_gpu=1",
    f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm",
    f"{ACTOR}.loss_scale_factor=32",
]


def instantiation_error(actor_from, overrides):
    """The message verl's config instantiation fails with (Hydra wraps the ValueError of our __post_init__)."""
    with pytest.raises(Exception) as error:  # noqa: B017  (hydra.errors.InstantiationException or ValueError)
        actor_from(BASE + overrides)
    return str(error.value)


def test_hydra_override_selects_atr_with_its_delta(actor_from):
    """`_target_` + `loss_mode=atr_grpo.atr` + `+delta=0.05` gives verl an actor whose loss is ATR at δ = 0.05."""
    actor = actor_from(BASE + [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.atr", f"+{ACTOR}.policy_loss.delta=0.05"])
    assert type(actor.policy_loss).__name__ == "ATRPolicyLossConfig" and actor.policy_loss.delta == 0.05
    inputs = verl_check.random_inputs()
    verl_loss, _ = verl_check.verl_actor_loss(actor, inputs)
    out = build_rule("atr", delta=0.05)(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask)
    ours = aggregate(out.loss, inputs.mask, "dr_grpo", max_completion_length=32)
    torch.testing.assert_close(verl_loss, ours, rtol=0, atol=verl_check.LOSS_TOLERANCE)
    at_default = verl_check.reference_loss(rule_at_defaults("atr"), "seq-mean-token-sum-norm", inputs, {})
    assert (verl_loss - at_default).abs().item() > 1e-4  # δ reached the loss


def test_semantics_and_other_rules_are_selectable(actor_from):
    """Any rule and any of its parameters: clip_higher's ε_high, ATR's mask semantics."""
    actor = actor_from(
        BASE + [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.clip_higher", f"+{ACTOR}.policy_loss.eps_high=0.3"]
    )
    assert plugin.rule_from_config(actor.policy_loss.loss_mode, actor.policy_loss).config() == {
        "eps_low": 0.2,
        "eps_high": 0.3,
    }
    actor = actor_from(BASE + [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.atr", f"+{ACTOR}.policy_loss.semantics=mask"])
    assert plugin.rule_from_config(actor.policy_loss.loss_mode, actor.policy_loss).semantics == "mask"


def test_bad_delta_is_refused_when_verl_builds_the_config(actor_from):
    """δ ≤ 0 fails while verl instantiates its config (before any model), naming the verl key and the range."""
    message = instantiation_error(
        actor_from, [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.atr", f"+{ACTOR}.policy_loss.delta=-0.1"]
    )
    assert "actor_rollout_ref.actor.policy_loss.delta" in message and "> 0" in message


def test_full_kl_is_refused_when_verl_builds_the_config(actor_from):
    message = instantiation_error(actor_from, [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.full_kl"])
    assert "'atr_grpo.full_kl' is not available under verl" in message


def test_rule_parameter_with_a_verl_loss_is_refused(actor_from):
    """δ with verl's `vanilla` would be ignored: refused, with a hint at bypass mode (which swaps loss_mode)."""
    message = instantiation_error(
        actor_from, [f"{ACTOR}.policy_loss.loss_mode=vanilla", f"+{ACTOR}.policy_loss.delta=0.05"]
    )
    assert "policy_loss.delta set, but" in message and "bypass_mode" in message
    actor = actor_from(BASE + [f"{ACTOR}.policy_loss.loss_mode=vanilla"])  # our class with verl's own loss is fine
    assert actor.policy_loss.loss_mode == "vanilla"


def test_config_survives_pickling(actor_from):
    """Ray ships the actor config to its workers by pickling: class and values come back unchanged."""
    actor = actor_from(BASE + [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.atr", f"+{ACTOR}.policy_loss.delta=0.05"])
    copy = pickle.loads(pickle.dumps(actor))
    assert type(copy.policy_loss) is plugin.ATRPolicyLossConfig and copy.policy_loss == actor.policy_loss


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ([f"{ACTOR}.loss_agg_mode=token-sum"], "actor_rollout_ref.actor.loss_agg_mode='token-sum'"),
        ([f"{ACTOR}.loss_agg_mode=seq-mean-token-sum"], "loss_agg_mode='seq-mean-token-sum'"),
        ([f"{ACTOR}.loss_scale_factor=null"], "set actor_rollout_ref.actor.loss_scale_factor"),
    ],
)
def test_unmapped_aggregation_is_refused_at_the_first_loss(actor_from, overrides, key):
    """verl's modes without a counterpart here (or Dr.GRPO without its constant) fail at the loss, naming the key."""
    actor = actor_from(BASE + [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.atr"] + overrides)
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.loss_") as error:
        verl_check.verl_actor_loss(actor, verl_check.random_inputs())
    assert key in str(error.value)


def test_changed_verl_clip_ratio_is_reported_once(actor_from, monkeypatch):
    """verl's clip_ratio_high does not reach an atr_grpo rule: a changed value gives one warning per loss mode."""
    monkeypatch.setattr(plugin, "_WARNED", set())
    actor = actor_from(BASE + [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.clip_higher", f"{ACTOR}.clip_ratio_high=0.28"])
    inputs = verl_check.random_inputs()
    with pytest.warns(UserWarning, match=r"atr_grpo\.clip_higher ignores actor_rollout_ref\.actor\.clip_ratio_high"):
        verl_check.verl_actor_loss(actor, inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        verl_check.verl_actor_loss(actor, inputs)  # said once is enough
    quiet = actor_from(BASE + [f"{ACTOR}.policy_loss.loss_mode=atr_grpo.atr"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        verl_check.verl_actor_loss(quiet, inputs)  # verl's defaults untouched: nothing to say


CLIP_COV = {"ratio": 0.5, "cov_lb": -1e3, "cov_ub": 1e3}  # half of the unclipped tokens detached, at random


def clip_cov_loss(seed, inputs):
    config = verl_check.actor_config("atr_grpo.clip_cov", "token-mean", inputs.mask.shape[1], seed=seed, **CLIP_COV)
    return verl_check.verl_actor_loss(config, inputs)[0]


def test_clip_cov_draws_its_keys_from_the_seeded_stream():
    """Clip-Cov under verl = our rule fed key seeds drawn from the generator of (actor.data_loader_seed, rank),
    advanced by every call."""
    inputs = verl_check.random_inputs()
    rule = build_rule("clip_cov", **CLIP_COV)
    stream = plugin.process_stream(7, rank=0)
    for _ in range(2):  # the second call draws the next keys of the same stream
        ours = aggregate(
            rule(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask, key_seed=key_seed_from(stream)).loss,
            inputs.mask,
            "token_mean",
        )
        torch.testing.assert_close(clip_cov_loss(7, inputs), ours, rtol=0, atol=verl_check.LOSS_TOLERANCE)
    plugin.reset_key_generators()
    first_of_7 = clip_cov_loss(7, inputs)
    assert (first_of_7 - clip_cov_loss(7, inputs)).abs().item() > 1e-6  # the stream moves on
    plugin.reset_key_generators()
    assert (first_of_7 - clip_cov_loss(8, inputs)).abs().item() > 1e-6  # another seed, other tokens
