"""The rollout correction: its weight against float64 oracles of TRL's and verl's definitions, exactly 1 when the
rollout engine and the trainer agree, every rule × every correction through the one loss composition, its metrics,
and the configs that refuse a correction without rollout log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import train_config
from test_clipping_math import extras_for

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.errors import ConfigError
from atr_grpo.losses import LossSettings, aggregate, grpo_loss
from atr_grpo.rollout_correction import CORRECTIONS, LEVELS, RolloutCorrection

MAX_LEN = 12
# every kind at every level, with TRL's default C_max (3) and an IcePop-like band
CORRECTIONS_UNDER_TEST = [
    RolloutCorrection(kind, level, low, high)
    for kind in ("tis", "mis")
    for level in LEVELS
    for low, high in ((None, 3.0), (0.5, 2.0))
]


def engine_batch(seed: int = 0, batch: int = 6, steps: int = MAX_LEN, gap: float = 0.4):
    """π_old's log-probs, the engine's (off by N(0, gap²) per token, one NaN) and a right-padded mask."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g, dtype=torch.float64) * 3
    sampling = old + torch.randn(batch, steps, generator=g, dtype=torch.float64) * gap
    sampling[1, 0] = math.nan  # a token the engine gave no log-prob for
    lengths = torch.randint(1, steps + 1, (batch,), generator=g)
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    sampling[~mask] = 5.0  # junk under the padding must not matter
    return old, sampling, mask


def oracle_weight(correction: RolloutCorrection, old, sampling, mask) -> torch.Tensor:
    """`[B, T]` in float64, written from TRL 1.15's `_generate_and_score_completions` (the ratio of exp((old −
    sampling)·mask) with NaN → 0, summed per sequence for sequence modes, clamped or masked to [C_min, C_max]) and
    verl 0.9.1's `compute_rollout_correction_weights` (the log-ratio clamped to ±20 before exp)."""
    low = -math.inf if correction.low is None else correction.low
    high = math.inf if correction.high is None else correction.high
    out = torch.zeros_like(old)
    for i in range(old.shape[0]):
        diffs = [0.0 if math.isnan(d) else d for d in (old[i] - sampling[i]).tolist()]
        valid = mask[i].tolist()
        if correction.level == "sequence":
            total = sum(d for d, v in zip(diffs, valid) if v)
            ratios = [math.exp(max(-20.0, min(20.0, total)))] * len(diffs)
        else:
            ratios = [math.exp(max(-20.0, min(20.0, d))) for d in diffs]
        for t, (ratio, v) in enumerate(zip(ratios, valid)):
            if not v:
                continue
            if correction.kind == "tis":
                out[i, t] = min(max(ratio, low), high)
            else:
                out[i, t] = ratio if low <= ratio <= high else 0.0
    return out


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
    """grpo_loss with a correction = aggregate(rule loss · ρ): the same in value and in gradient, for every rule
    (but those that own the correction, which refuse ours: test_owned_correction)."""
    old, sampling, mask = engine_batch(seed=3)
    old, sampling = old.float(), sampling.float()
    g = torch.Generator().manual_seed(4)
    logp = old + torch.randn(old.shape, generator=g) * 0.3
    advantages = torch.randn(old.shape[0], generator=g)
    rule = build_rule(name)
    extras = extras_for(rule, logp)
    weight = oracle_weight(correction, old.double(), sampling.double(), mask).float()

    leaf = logp.clone().requires_grad_()
    settings = LossSettings(max_completion_length=MAX_LEN, correction=correction)
    got = grpo_loss(rule, leaf, old, advantages, mask, settings, sampling_logp=sampling, extras=extras).loss
    (got_grad,) = torch.autograd.grad(got, leaf)

    leaf = logp.clone().requires_grad_()
    plain = rule(leaf, old, advantages, mask, **extras).loss
    want = aggregate(plain * weight, mask, "dr_grpo", MAX_LEN)
    (want_grad,) = torch.autograd.grad(want, leaf)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-8)


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
