"""The rollout correction: its weight against float64 oracles of TRL's and verl's definitions, exactly 1 when the
rollout engine and the trainer agree, every rule × every correction through the one loss composition, its metrics,
and the configs that refuse a correction without rollout log-probs."""

from __future__ import annotations

import pytest
import torch
from conftest import train_config
from helpers.rule_checks import CORRECTIONS_UNDER_TEST, oracle_weight, weighted_by_each_correction
from helpers.rule_inputs import MAX_LEN, engine_batch

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.errors import ConfigError
from atr_grpo.losses import LossSettings, grpo_loss
from atr_grpo.rollout_correction import CORRECTIONS, LEVELS, RolloutCorrection


@pytest.mark.parametrize("correction", CORRECTIONS_UNDER_TEST, ids=repr)
def test_the_weight_is_trls_and_verls(correction):
    old, sampling, mask = engine_batch()
    weight = correction.weight(old, sampling, mask).expand(mask.shape).double() * mask
    expected = oracle_weight(correction, old, sampling, mask)
    torch.testing.assert_close(weight, expected, rtol=1e-6, atol=1e-7)
    assert (weight != 1).any() and (weight[mask] > 0).any()  # the batch does exercise the correction
    if correction.low is not None:  # the band [0.5, 2] is crossed on both sides
        assert ((expected == 0) if correction.kind == "mis" else (expected == correction.low))[mask].any()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", CORRECTIONS)
@pytest.mark.parametrize("band", [(None, 2.0), (1.0, 1.0), (0.9, None)])
def test_identical_rollout_and_old_log_probs_give_a_weight_of_exactly_1(kind, level, band):
    """The engine agreeing with the trainer changes nothing: ρ ≡ 1 on every valid token, even for the tightest
    band [1, 1], and nothing is counted as truncated or masked."""
    correction = RolloutCorrection(kind, level, *band)
    old, _, mask = engine_batch(seed=1)
    weight = correction.weight(old, old.clone(), mask).expand(mask.shape)
    assert torch.equal(weight[mask], torch.ones_like(weight[mask]))
    metrics = correction.metrics(old, old.clone(), mask)
    if kind != "none":
        assert (metrics["rollout/weight_min"], metrics["rollout/weight_max"]) == (1.0, 1.0)
        assert metrics.get("rollout/truncated_frac", metrics.get("rollout/masked_frac")) == 0.0


def test_the_metrics_describe_the_weight_on_valid_tokens():
    correction = RolloutCorrection("mis", "token", 0.8, 1.25)
    old, sampling, mask = engine_batch(seed=2)
    expected = oracle_weight(correction, old, sampling, mask)[mask]
    metrics = correction.metrics(old, sampling, mask)
    assert metrics["rollout/weight_mean"] == pytest.approx(float(expected.mean()), rel=1e-6)
    assert metrics["rollout/weight_min"] == 0.0
    assert metrics["rollout/weight_max"] == pytest.approx(float(expected.max()), rel=1e-6)
    assert metrics["rollout/masked_frac"] == pytest.approx(float((expected == 0).double().mean()))
    assert 0 < metrics["rollout/masked_frac"] < 1
    truncated = RolloutCorrection("tis", "token", 0.8, 1.25).metrics(old, sampling, mask)
    assert truncated["rollout/truncated_frac"] == metrics["rollout/masked_frac"]  # the same tokens leave the band
    assert truncated["rollout/weight_min"] == pytest.approx(0.8) and truncated["rollout/weight_max"] == 1.25
    assert RolloutCorrection().metrics(old, sampling, mask) == {}


@pytest.mark.parametrize("correction", CORRECTIONS_UNDER_TEST[:4], ids=repr)
@pytest.mark.parametrize("name", sorted(name for name, rule in RULES.items() if not rule.owns_correction))
def test_every_rule_with_every_correction_is_the_rules_loss_times_the_weight(name, correction):
    weighted_by_each_correction(name, correction)


def test_a_correction_without_the_engines_log_probs_is_an_error():
    old, _, mask = engine_batch()
    settings = LossSettings(max_completion_length=MAX_LEN, correction=RolloutCorrection("tis"))
    with pytest.raises(ValueError, match="rollout.correction=tis needs the rollout engine's log-probs"):
        grpo_loss(build_rule("atr"), old.float(), old.float(), torch.ones(6), mask, settings)


# ---------------------------------------------------------------------------------------------- configs
def test_the_config_builds_the_correction():
    cfg = train_config(
        [
            "rollout.correction=mis",
            "rollout.correction_level=sequence",
            "rollout.correction_min=0.5",
            "rollout.engine=vllm",
        ]
    )
    assert cfg.rollout.rollout_correction() == RolloutCorrection("mis", "sequence", 0.5, 2.0)
    assert train_config([]).rollout.rollout_correction() == RolloutCorrection("none")


def test_auto_engine_resolving_to_hf_refuses_a_correction_before_anything_loads():
    """On a machine without CUDA rollout.engine=auto means transformers' generate: no rollout log-probs."""
    from atr_grpo.machine import Machine, decide

    cfg = train_config(["experiment=smoke", "rollout.correction=tis"])
    with pytest.raises(ConfigError, match="rollout.correction must be 'none' with rollout.engine='hf'"):
        decide(cfg, Machine(cuda=False, unsloth=False, vllm=True))
