"""A rule that owns the rollout correction (`ClipRule.owns_correction`) receives the sampling log-ratio
log π_old − log π_sampler, and no ρ is applied after it: a toy rule that applies token-level TIS itself gives the
reference rule's loss under our TIS, in value and gradient. Without the engine's log-probs, beside a correction of
ours, without vLLM rollouts, or under verl, it is refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import train_config
from helpers.rule_inputs import MAX_LEN, engine_batch
from helpers.toy_rules import OWNED_TIS_MAX, OwnedTIS, registered

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.errors import ConfigError
from atr_grpo.integrations import verl as plugin
from atr_grpo.losses import LossSettings, grpo_loss
from atr_grpo.rollout_correction import RolloutCorrection, sampling_log_ratio
from atr_grpo.training.rule_trainer import RuleTrainerMixin

NO_CORRECTION = LossSettings(max_completion_length=MAX_LEN)


@pytest.fixture
def owned():
    with registered(OwnedTIS) as rule:
        yield rule


def policy_batch(seed: int = 5):
    old, sampling, mask = engine_batch(seed)
    g = torch.Generator().manual_seed(seed + 1)
    logp = old.float() + 0.3 * torch.randn(old.shape, generator=g)
    return logp, old.float(), sampling.float(), torch.randn(old.shape[0], generator=g), mask


def test_the_sampling_log_ratio_is_old_minus_sampler_on_valid_tokens():
    """log π_old − log π_sampler, 0 on padding and where the engine gave no log-prob (NaN), clamped to ±20."""
    _, old, sampling, _, mask = policy_batch()
    sampling[0, 0] = old[0, 0] + 30.0
    got = sampling_log_ratio(old, sampling, mask)
    want = torch.where(mask, old - sampling, 0.0).nan_to_num(nan=0.0).clamp(-20, 20)
    assert got[1, 0] == 0.0 and got[0, 0] == -20.0 and (got[~mask] == 0).all()
    torch.testing.assert_close(got, want)


def test_a_rule_owning_the_correction_equals_the_reference_rule_under_ours(owned):
    logp, old, sampling, advantages, mask = policy_batch()
    leaf = logp.clone().requires_grad_()
    got = grpo_loss(owned, leaf, old, advantages, mask, NO_CORRECTION, sampling_logp=sampling)
    (got_grad,) = torch.autograd.grad(got.loss, leaf)
    assert got.correction_weight is None  # no ρ after the rule

    tis = RolloutCorrection("tis", "token", None, OWNED_TIS_MAX)
    settings = LossSettings(max_completion_length=MAX_LEN, correction=tis)
    leaf = logp.clone().requires_grad_()
    want = grpo_loss(build_rule("no_clip"), leaf, old, advantages, mask, settings, sampling_logp=sampling)
    (want_grad,) = torch.autograd.grad(want.loss, leaf)
    torch.testing.assert_close(got.loss, want.loss)
    torch.testing.assert_close(got_grad, want_grad)
    plain = grpo_loss(build_rule("no_clip"), logp, old, advantages, mask, NO_CORRECTION).loss
    assert not torch.allclose(got.loss, plain)  # the correction does act on this batch


def test_a_rule_owning_the_correction_is_refused_without_its_input(owned):
    logp, old, sampling, advantages, mask = policy_batch()
    with pytest.raises(ValueError, match="'test_owned_tis' owns the rollout correction and needs the rollout engine"):
        grpo_loss(owned, logp, old, advantages, mask, NO_CORRECTION)
    with pytest.raises(ValueError, match=r"owns the rollout correction and needs 'sampling_log_ratio' \(\[B, T\]"):
        owned(logp, old, advantages, mask)
    tis = LossSettings(max_completion_length=MAX_LEN, correction=RolloutCorrection("tis"))
    with pytest.raises(ValueError, match="applies the rollout correction itself; set rollout.correction=none"):
        grpo_loss(owned, logp, old, advantages, mask, tis, sampling_logp=sampling)


def test_the_trainer_refuses_a_batch_without_the_engines_log_probs(owned):
    class Trainer(RuleTrainerMixin):
        def __init__(self) -> None:
            self._setup_rule(owned, NO_CORRECTION)
            self.model = SimpleNamespace(training=True)

    trainer = Trainer()
    trainer.check_sampling_logp(torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="clipping.name=test_owned_tis .*carries no log-probs from the rollout"):
        trainer.check_sampling_logp(None)


def test_verl_refuses_a_rule_owning_the_correction(owned):
    message = plugin.refusal(RULES["test_owned_tis"])
    assert message is not None and plugin.OWNED_CORRECTION_REASON in message
    with pytest.raises(ValueError, match="'atr_grpo.test_owned_tis' is not available under verl: .* itself"):
        plugin.rule_from_config("atr_grpo.test_owned_tis", {})
    assert plugin.refusal(RULES["no_clip"]) is None


def test_the_machine_check_refuses_hf_rollouts_and_a_second_correction(monkeypatch):
    """Before anything loads: the rule's input needs vLLM's log-probs, and ρ must not be applied twice."""
    from atr_grpo.machine import Machine, decide

    cpu_vllm = Machine(cuda=False, unsloth=False, vllm=True)
    cfg = train_config(["experiment=smoke", "rollout.engine=hf"])
    decide(cfg, cpu_vllm)  # the rule as registered: accepted
    monkeypatch.setattr(RULES[cfg.clipping.name], "owns_correction", True)
    with pytest.raises(ConfigError, match="rollout.engine must be 'vllm' with clipping.name=.*owns the rollout"):
        decide(cfg, cpu_vllm)
    cfg = train_config(["experiment=smoke", "rollout.engine=vllm", "rollout.correction=tis"])
    with pytest.raises(ConfigError, match="rollout.correction must be 'none' with clipping.name="):
        decide(cfg, cpu_vllm)
