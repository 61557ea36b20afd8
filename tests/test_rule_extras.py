"""The extras registry (`clipping.extras`, and the trainer's providers in `training.extras`): an extra is declared
once, and the trainer, the verl plugin, the fixtures and the rules' registration all go through that declaration. A
dummy extra and a dummy rule that needs it, registered inside the test only, reach the rule's loss from the trainer's
provider and from the fixture, and verl refuses the rule with the extra's reason."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from atr_grpo.clipping import RULES, ClipRule, RuleTerms, TokenBatch, build_rule, ratio_from_log, register
from atr_grpo.clipping.extras import (
    EXTRAS,
    Extra,
    Unavailable,
    VerlCall,
    check_needs,
    fixture_extras,
    register_extra,
    verl_extras,
)
from atr_grpo.integrations import verl as plugin
from atr_grpo.training.extras import TRAINER_PROVIDERS, TrainerBatch, register_trainer_extra, trainer_extras
from atr_grpo.training.rule_trainer import RuleTrainerMixin

REASON = "a per-token temperature that verl's policy-loss API does not pass"


def scale_from_trainer(batch: TrainerBatch) -> Tensor:
    """Off-policy: the micro-batch's random draw, on-policy: 1 (so the rule's loss shows which one reached it)."""
    if batch.on_policy:
        return torch.ones_like(batch.like)
    return 1 + torch.rand(batch.like.shape, generator=batch.random())


def scaled_rule_class() -> type[ClipRule]:
    class Scaled(ClipRule):
        """−w·A times a per-token scale given as the extra `token_scale`."""

        name = "test_scaled"
        family = "ratio"
        needs = ("token_scale",)

        def terms(self, batch: TokenBatch, token_scale: Tensor, **_: object) -> RuleTerms:
            never = torch.zeros_like(batch.mask)
            loss = -ratio_from_log(batch.log_ratio) * batch.advantages * token_scale
            return RuleTerms(loss=loss, frozen_low=never, frozen_high=never)

    return Scaled


@pytest.fixture
def scaled_rule():
    """The extra `token_scale` and the rule `test_scaled`, registered for one test and removed after it."""
    register_extra(
        Extra(
            name="token_scale",
            meaning="[B, T] float: a weight per token",
            from_verl=Unavailable(REASON),
            fixture=lambda like, generator: 1 + torch.rand(like.shape, generator=generator, dtype=like.dtype),
        )
    )
    register_trainer_extra("token_scale", scale_from_trainer)
    try:
        register(scaled_rule_class())
        yield build_rule("test_scaled")
    finally:
        RULES.pop("test_scaled", None)
        EXTRAS.pop("token_scale")
        TRAINER_PROVIDERS.pop("token_scale")


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


def test_a_rule_needing_an_unregistered_extra_is_refused_at_registration():
    class Unknown(ClipRule):
        name = "test_unknown_extra"
        family = "ratio"
        needs = ("no_such_extra",)

    with pytest.raises(ValueError) as error:
        register(Unknown)
    message = str(error.value)
    assert "'test_unknown_extra' needs the extra 'no_such_extra', which is not registered" in message
    assert "registered extras: full_kl, key_seed" in message
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
