"""The extras registry (`clipping.extras`, and the trainer's providers in `training.extras`): an extra is declared
once, and the trainer, the verl plugin, the fixtures and the rules' registration all go through that declaration. A
dummy extra and a dummy rule that needs it, registered inside the test only, reach the rule's loss from the trainer's
provider and from the fixture, and verl refuses the rule with the extra's reason."""

from __future__ import annotations

import pytest
import torch
from helpers import toy_rules
from helpers.toy_rules import REASON

from atr_grpo.clipping import RULES, ClipRule, build_rule, register
from atr_grpo.clipping.extras import (
    EXTRAS,
    VerlCall,
    check_needs,
    fixture_extras,
    register_extra,
    verl_extras,
)
from atr_grpo.integrations import verl as plugin
from atr_grpo.losses import LossSettings, grpo_loss
from atr_grpo.training.extras import TRAINER_PROVIDERS, TrainerBatch, register_trainer_extra, trainer_extras
from atr_grpo.training.rule_trainer import RuleTrainerMixin


@pytest.fixture
def scaled_rule():
    """The extra `token_scale` and the rule `test_scaled`, registered for one test and removed after it."""
    with toy_rules.scaled_rule() as rule:
        yield rule


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 5, generator=g) * 2
    logp = old + 0.3 * torch.randn(3, 5, generator=g)
    return logp, old, torch.randn(3, generator=g), torch.rand(3, 5, generator=g) > 0.2


class Trainer(RuleTrainerMixin):
    """What `rule_extras` reads of a GRPOTrainer, without a model."""

    def __init__(self, rule: ClipRule) -> None:
        from types import SimpleNamespace

        from atr_grpo.losses import LossSettings

        self._setup_rule(rule, LossSettings(max_completion_length=5))
        self.args = SimpleNamespace(seed=3)
        self.state = SimpleNamespace(global_step=2)
        self._step = 1
        self.current_gradient_accumulation_steps = 4
        self.accelerator = SimpleNamespace(process_index=0, unwrap_model=lambda model: model)
        self.temperature = 1.0


def test_the_trainers_provider_reaches_the_rules_loss(scaled_rule):
    """`rule_extras` hands the rule what the extra's trainer provider makes of the micro-batch: the registered
    off-policy draw, 1 on-policy; the loss is the plain −w·A times it."""
    logp, old, advantages, mask = batch()
    trainer = Trainer(scaled_rule)
    off = trainer.rule_extras(None, None, None, 5, logp, has_old=True)
    on = trainer.rule_extras(None, None, None, 5, logp, has_old=False)
    assert set(off) == {"token_scale"} and torch.equal(on["token_scale"], torch.ones_like(logp))
    assert (off["token_scale"] > 1).all()
    assert torch.equal(off["token_scale"], trainer.rule_extras(None, None, None, 5, logp, has_old=True)["token_scale"])
    plain = build_rule("no_clip")(logp, old, advantages, mask).loss
    scaled = scaled_rule(logp, old, advantages, mask, **off).loss
    torch.testing.assert_close(scaled, plain * off["token_scale"] * mask)
    assert not torch.allclose(scaled, plain)
    torch.testing.assert_close(scaled_rule(logp, old, advantages, mask, **on).loss, plain)


def test_the_fixture_reaches_the_rules_loss(scaled_rule):
    logp, old, advantages, mask = batch(1)
    extras = fixture_extras(scaled_rule.needs, logp, seed=5)
    assert extras["token_scale"].shape == logp.shape and (extras["token_scale"] >= 1).all()
    plain = build_rule("no_clip")(logp, old, advantages, mask).loss
    torch.testing.assert_close(scaled_rule(logp, old, advantages, mask, **extras).loss, plain * extras["token_scale"])
    other = fixture_extras(scaled_rule.needs, logp, seed=6)
    assert not torch.equal(extras["token_scale"], other["token_scale"])


def test_verl_refuses_the_rule_with_the_extras_reason(scaled_rule):
    message = plugin.refusal(RULES["test_scaled"])
    assert message is not None and "'token_scale': " + REASON in message
    with pytest.raises(ValueError, match="'atr_grpo.test_scaled' is not available under verl.*" + REASON):
        plugin.rule_from_config("atr_grpo.test_scaled", {})
    with pytest.raises(ValueError, match="'token_scale' is not available under verl"):
        verl_extras(scaled_rule.needs, VerlCall(like=torch.zeros(3, 5), random=torch.Generator))


def test_a_missing_extra_is_named_by_the_call(scaled_rule):
    logp, old, advantages, mask = batch()
    with pytest.raises(ValueError, match=r"'test_scaled' needs the extra 'token_scale' \(\[B, T\] float: a weight"):
        scaled_rule(logp, old, advantages, mask)


def test_a_missing_extra_is_named_on_the_trainer_path(scaled_rule):
    """`grpo_loss` (the TRL and Unsloth paths) goes through the same `apply` as a call, so it refuses alike."""
    logp, old, advantages, mask = batch()
    settings = LossSettings(max_completion_length=5)
    with pytest.raises(ValueError, match=r"'test_scaled' needs the extra 'token_scale' \(\[B, T\] float: a weight"):
        grpo_loss(scaled_rule, logp, old, advantages, mask, settings)
    with pytest.raises(ValueError, match="needs the extra 'token_scale'"):
        grpo_loss(scaled_rule, logp, old, advantages, mask, settings, extras={"token_scale": None})


def test_the_trainer_path_equals_a_call_and_compiles_in_one_graph(scaled_rule):
    """`grpo_loss` masks the rule's loss exactly as a call does, and the extras check adds no graph break: the
    whole loss traces under `torch.compile(fullgraph=True)`."""
    logp, old, advantages, mask = batch(2)
    extras = fixture_extras(scaled_rule.needs, logp, seed=3)
    settings = LossSettings(loss_agg="token_mean")
    want = scaled_rule(logp, old, advantages, mask, **extras).loss
    result = grpo_loss(scaled_rule, logp, old, advantages, mask, settings, extras=extras)
    torch.testing.assert_close(result.terms.loss * mask, want)
    torch.testing.assert_close(result.loss, want.sum() / mask.sum())

    def loss(logp, old, advantages, mask, token_scale):
        return grpo_loss(scaled_rule, logp, old, advantages, mask, settings, extras={"token_scale": token_scale}).loss

    compiled = torch.compile(loss, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(logp, old, advantages, mask, extras["token_scale"]), result.loss)


def test_a_sequence_level_extra_reaches_the_loss_on_the_trainer_path():
    """A `[B, 1]` extra from the trainer's provider goes through `grpo_loss` as it is: each sequence's tokens are
    weighed by its value, in loss and gradient, and padding stays 0."""
    logp, old, advantages, mask = batch(4)
    with toy_rules.scaled_rule(per_sequence=True) as rule:
        extras = Trainer(rule).rule_extras(None, None, None, 5, logp, has_old=True)
        scale = extras["sequence_scale"]
        assert scale.shape == (3, 1) and (scale > 1).all() and scale.unique().numel() == 3
        leaf = logp.clone().requires_grad_()
        result = grpo_loss(rule, leaf, old, advantages, mask, LossSettings(loss_agg="token_mean"), extras=extras)
        (grad,) = torch.autograd.grad(result.loss, leaf)
    plain_leaf = logp.clone().requires_grad_()
    plain = build_rule("no_clip")(plain_leaf, old, advantages, mask).loss
    (plain_grad,) = torch.autograd.grad(plain.sum() / mask.sum(), plain_leaf)
    torch.testing.assert_close(result.loss, (plain * scale).sum() / mask.sum())
    torch.testing.assert_close(grad, plain_grad * scale)
    assert (grad[~mask] == 0).all()


def test_a_rule_needing_an_unregistered_extra_is_refused_at_registration():
    class Unknown(ClipRule):
        name = "test_unknown_extra"
        family = "ratio"
        needs = ("no_such_extra",)

    with pytest.raises(ValueError) as error:
        register(Unknown)
    message = str(error.value)
    assert "'test_unknown_extra' needs the extra 'no_such_extra', which is not registered" in message
    assert "registered extras: entropy_ratio, full_kl, key_seed" in message
    assert "test_unknown_extra" not in RULES
    check_needs("clip_cov", RULES["clip_cov"].needs)  # the registry's own rules pass


def test_an_extra_is_registered_once():
    with pytest.raises(ValueError, match="extra 'key_seed' is registered twice"):
        register_extra(EXTRAS["key_seed"])
    with pytest.raises(ValueError, match="provider of the extra 'key_seed' is registered twice"):
        register_trainer_extra("key_seed", TRAINER_PROVIDERS["key_seed"].compute)


def test_the_trainer_provides_every_registered_extra():
    assert set(TRAINER_PROVIDERS) == set(EXTRAS)


def test_an_extra_without_a_trainer_provider_is_named_at_the_first_rollout(scaled_rule):
    """A rule whose extra has no trainer provider: the rollout (which asks whether π_old's weights must be kept) and
    the micro-batch's extras name the extra and how to provide it."""
    trainer = Trainer(scaled_rule)
    provider = TRAINER_PROVIDERS.pop("token_scale")
    message = r"cannot provide the extra 'token_scale' \(\[B, T\] float: a weight per token\).*register_trainer_extra"
    try:
        with pytest.raises(ValueError, match=message):
            trainer._generate_and_score_completions(None)
        with pytest.raises(ValueError, match=message):
            trainer.rule_extras(None, None, None, 5, torch.zeros(3, 5), has_old=True)
    finally:
        TRAINER_PROVIDERS["token_scale"] = provider


def test_clip_cov_gets_the_same_key_seed_from_the_trainer_verl_and_the_fixture_given_one_stream():
    """The three sources of `key_seed` draw it the same way from a generator: the same stream, the same seed."""
    like = torch.zeros(2, 4)

    def stream():
        return torch.Generator().manual_seed(11)

    trainer_batch = TrainerBatch(like, False, stream, None, None, None, None, 4, 1.0)
    from_trainer = trainer_extras(("key_seed",), trainer_batch)["key_seed"]
    from_verl = verl_extras(("key_seed",), VerlCall(like=like, random=stream))["key_seed"]
    from_fixture = fixture_extras(("key_seed",), like, seed=11)["key_seed"]
    assert from_trainer.dim() == 0 and from_trainer.dtype == torch.int64
    assert int(from_trainer) == int(from_verl) == int(from_fixture)
