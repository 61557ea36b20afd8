"""The rollout correction: its weight against float64 oracles of TRL's and verl's definitions, exactly 1 when the
rollout engine and the trainer agree, every rule × every correction through the one loss composition, its metrics,
the rejection of whole sequences (verl's rollout_rs), and the configs that refuse a correction without rollout
log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import train_config
from helpers.rule_checks import CORRECTIONS_UNDER_TEST, oracle_weight, weighted_by_each_correction
from helpers.rule_inputs import MAX_LEN, engine_batch

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.errors import ConfigError
from atr_grpo.losses import LossSettings, grpo_loss
from atr_grpo.rollout_correction import CORRECTIONS, LEVELS, REJECTIONS, RolloutCorrection


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


def test_the_config_builds_a_rejection_chained_with_a_correction():
    cfg = train_config(
        [
            "rollout.correction=tis",
            "rollout.rejection=seq_mean_k3",
            "rollout.rejection_threshold=0.01",
            "rollout.engine=vllm",
        ]
    )
    assert cfg.rollout.rollout_correction() == RolloutCorrection("tis", "token", None, 2.0, "seq_mean_k3", 0.01)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.rejection=seq_max_k3"], "rollout.rejection_threshold must be a finite number > 0 with rollout.rej"),
        (["rollout.rejection=seq_max_k3", "rollout.rejection_threshold=0"], "rollout.rejection_threshold must be a"),
        (["rollout.rejection_threshold=0.1"], "rollout.rejection_threshold must be null with rollout.rejection='none'"),
        (["rollout.rejection=seq_sum_k1"], "rollout.rejection must be one of 'none', 'seq_max_k2', 'seq_max_k3', 'seq"),
    ],
)
def test_a_rejection_is_refused_naming_its_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        train_config(["rollout.engine=vllm", *overrides])


def test_a_rejection_needs_the_engines_log_probs_and_a_rule_that_leaves_the_correction_to_us():
    from atr_grpo.machine import Machine, decide

    rejecting = ["rollout.rejection=seq_max_k2", "rollout.rejection_threshold=0.5"]
    with pytest.raises(ConfigError, match="rollout.rejection must be 'none' with rollout.engine='hf'"):
        train_config(["rollout.engine=hf", *rejecting])
    with pytest.raises(ConfigError, match="rollout.rejection must be 'none' with rollout.engine='hf'"):
        decide(train_config(["experiment=smoke", *rejecting]), Machine(cuda=False, unsloth=False, vllm=True))
    owner = next(name for name, rule in RULES.items() if rule.owns_correction)
    gpu = Machine(cuda=True, unsloth=True, vllm=True)
    with pytest.raises(ConfigError, match=f"rollout.rejection must be 'none' with clipping.name={owner}"):
        decide(train_config(["experiment=smoke", f"clipping={owner}", *rejecting]), gpu)


def test_auto_engine_resolving_to_hf_refuses_a_correction_before_anything_loads():
    """On a machine without CUDA rollout.engine=auto means transformers' generate: no rollout log-probs."""
    from atr_grpo.machine import Machine, decide

    cfg = train_config(["experiment=smoke", "rollout.correction=tis"])
    with pytest.raises(ConfigError, match="rollout.correction must be 'none' with rollout.engine='hf'"):
        decide(cfg, Machine(cuda=False, unsloth=False, vllm=True))


# --------------------------------------------------------------------------------------------- rejection
def oracle_statistic(rejection, old, sampling, mask):
    """Each sequence's divergence from the rollout policy in float64, written from verl 0.9.1's
    `compute_rollout_rejection_mask`: log r clamped to ±20, k2 = ½ (log r)², k3 = r − 1 − log r, their max or mean
    over valid tokens (0 for none); a token without the engine's log-prob has log r = 0."""
    stats = []
    for i in range(old.shape[0]):
        logs = [max(-20.0, min(20.0, 0.0 if math.isnan(d) else d)) for d, v in zip(old[i] - sampling[i], mask[i]) if v]
        values = [0.5 * d * d if rejection.endswith("k2") else math.exp(d) - 1 - d for d in logs]
        if rejection.startswith("seq_max"):
            stats.append(max(values, default=0.0))
        else:
            stats.append(sum(values) / max(len(values), 1))
    return torch.tensor(stats, dtype=torch.float64)


def median_threshold(stats):
    """A threshold that keeps about half of the sequences: halfway between two neighbouring statistics."""
    ordered = stats.sort().values
    middle = len(ordered) // 2
    return float((ordered[middle - 1] + ordered[middle]) / 2)


@pytest.mark.parametrize("rejection", REJECTIONS[1:])
def test_rejection_keeps_the_sequences_whose_divergence_is_within_the_threshold(rejection):
    old, sampling, mask = engine_batch(seed=5, batch=8)
    stats = oracle_statistic(rejection, old, sampling, mask)
    threshold = median_threshold(stats)
    kept = RolloutCorrection("none", rejection=rejection, rejection_threshold=threshold).kept(old, sampling, mask)
    assert kept.shape == (8, 1)
    assert kept.squeeze(1).tolist() == (stats <= threshold).tolist()
    assert 0 < int(kept.sum()) < 8, "the threshold splits the batch"
    agree = RolloutCorrection("none", rejection=rejection, rejection_threshold=1e-12).kept(old, old.clone(), mask)
    assert agree.all(), "an engine that agrees with the trainer loses no sequence"


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean", "dr_grpo"])
@pytest.mark.parametrize("kind", ["none", "tis"])
def test_a_rejected_sequence_adds_nothing_and_leaves_token_means_normaliser(loss_agg, kind):
    """With a rejection, the loss is the loss of the kept rows alone, ρ included: token_mean divides by the kept
    tokens, seq_mean by all the sequences (rejected ones weigh 0), Dr.GRPO by its constant; rejected rows get no
    gradient."""
    old, sampling, mask = engine_batch(seed=6, batch=8)
    old, sampling = old.float(), sampling.float()
    advantages = torch.randn(8, generator=torch.Generator().manual_seed(7))
    threshold = median_threshold(oracle_statistic("seq_max_k3", old.double(), sampling.double(), mask))
    correction = RolloutCorrection(kind, "token", None, 1.2, "seq_max_k3", threshold)
    kept = correction.kept(old, sampling, mask).squeeze(1)
    logp = (old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(8))).requires_grad_()
    rule = build_rule("clip")
    settings = LossSettings(loss_agg=loss_agg, max_completion_length=MAX_LEN, correction=correction)
    result = grpo_loss(rule, logp, old, advantages, mask, settings, sampling_logp=sampling)
    (grad,) = torch.autograd.grad(result.loss, logp)
    alone = LossSettings(loss_agg=loss_agg, max_completion_length=MAX_LEN, correction=RolloutCorrection(kind, high=1.2))
    rows = kept.nonzero().squeeze(1)
    part = grpo_loss(rule, logp[rows], old[rows], advantages[rows], mask[rows], alone, sampling_logp=sampling[rows])
    expected = part.loss * (1 if loss_agg == "token_mean" else len(rows) / 8)  # per-sequence normalisers: B
    torch.testing.assert_close(result.loss, expected, rtol=1e-6, atol=1e-7)
    assert (grad[~kept] == 0).all() and (grad[kept][mask[kept]] != 0).any()
    unrejected = grpo_loss(rule, logp, old, advantages, mask, alone, sampling_logp=sampling)
    assert (unrejected.loss - result.loss).abs() > 1e-5


def test_the_rejected_share_is_logged_over_the_completions_tokens():
    old, sampling, mask = engine_batch(seed=5, batch=8)
    threshold = median_threshold(oracle_statistic("seq_mean_k3", old, sampling, mask))
    correction = RolloutCorrection("tis", rejection="seq_mean_k3", rejection_threshold=threshold)
    kept = correction.kept(old, sampling, mask)
    metrics = correction.metrics(old, sampling, mask)
    expected = float((mask & ~kept).sum() / mask.sum())
    assert metrics["rollout/rejected_frac"] == pytest.approx(expected) and 0 < expected < 1
    assert "rollout/weight_mean" in metrics, "the weight's metrics stay beside it"
    rejecting_only = RolloutCorrection("none", rejection="seq_mean_k3", rejection_threshold=threshold)
    assert rejecting_only.metrics(old, sampling, mask) == {"rollout/rejected_frac": pytest.approx(expected)}


def test_a_rejection_without_the_engines_log_probs_is_an_error():
    old, _, mask = engine_batch()
    correction = RolloutCorrection("none", rejection="seq_max_k2", rejection_threshold=0.5)
    settings = LossSettings(max_completion_length=MAX_LEN, correction=correction)
    with pytest.raises(ValueError, match="rollout.rejection=seq_max_k2 needs the rollout engine's log-probs"):
        grpo_loss(build_rule("atr"), old.float(), old.float(), torch.ones(6), mask, settings)
