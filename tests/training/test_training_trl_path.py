"""The TRL path: our `_compute_loss` equals TRL's built-in Dr.GRPO loss where TRL has the same rule, and every
registered rule trains through it (loss, gradient and metrics on a real tiny model)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import train_config
from trl import GRPOTrainer

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.training.extras import keeps_old_weights


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig

    from atr_grpo.models import load_model_and_tokenizer
    from atr_grpo.rewards import reward_function, truncation_rule
    from atr_grpo.training.rule_trainer import grpo_arg_values, loss_settings
    from atr_grpo.training.trl_backend import RuleGRPOTrainer
    from atr_grpo.truncation import stop_token_ids

    cfg = train_config(["experiment=smoke", "trainer.gradient_accumulation_steps=2"])
    model, tokenizer = load_model_and_tokenizer(cfg.model, for_training=True)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 1 + 1?"}]] * 8, "answer": ["2"] * 8})
    out = tmp_path_factory.mktemp("trl_path")
    stop_ids = stop_token_ids(model, tokenizer)
    trainer = RuleGRPOTrainer(
        model=model,
        reward_funcs=[reward_function(cfg, stop_ids)],
        args=GRPOConfig(**grpo_arg_values(cfg, out, "hf")),
        train_dataset=data,
        processing_class=tokenizer,
        rule=build_rule("clip"),
        settings=loss_settings(cfg),
        truncation=truncation_rule(cfg, stop_ids),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    return trainer


def make_inputs(trainer, seed: int = 0, batch: int = 8, prompt_len: int = 6, completion_len: int = 9):
    """A GRPO micro-batch as TRL's _prepare_inputs returns it, with stale π_old log-probs (w ≠ 1), on the model's
    device (drawn on the CPU, so a GPU run draws the same batch)."""
    g = torch.Generator().manual_seed(seed)
    device = trainer.accelerator.device
    vocab = trainer.model.config.vocab_size
    prompt_ids = torch.randint(3, vocab, (batch, prompt_len), generator=g)
    prompt_mask = torch.ones(batch, prompt_len, dtype=torch.long)
    prompt_mask[: batch // 2, :2] = 0  # left padding
    completion_ids = torch.randint(3, vocab, (batch, completion_len), generator=g)
    lengths = torch.randint(2, completion_len + 1, (batch,), generator=g)
    completion_mask = (torch.arange(completion_len)[None, :] < lengths[:, None]).long()
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(batch, generator=g),
    }
    inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
    prompt_ids, prompt_mask, completion_ids, completion_mask = (
        inputs[name] for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    )
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        mask = torch.cat([prompt_mask, completion_mask], 1)
        logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, completion_len)
    # log-ratios spread well beyond every clip range, both ways
    inputs["old_per_token_logps"] = logp + 0.6 * torch.randn(logp.shape, generator=g).to(device)
    return inputs


def loss_and_grad(trainer, compute, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = compute(trainer, trainer.model, inputs)
    loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters() if p.requires_grad]
    return loss.detach(), grads


@pytest.mark.parametrize(
    ("rule", "params", "trl_settings"),
    [
        ("clip", {"eps": 0.2}, {"epsilon_low": 0.2, "epsilon_high": 0.2, "delta": None}),
        (
            "clip_higher",
            {"eps_low": 0.2, "eps_high": 0.28},
            {"epsilon_low": 0.2, "epsilon_high": 0.28, "delta": None},
        ),
        (
            "dual_clip",
            {"eps_low": 0.2, "eps_high": 0.2, "c": 3.0},
            {"epsilon_low": 0.2, "epsilon_high": 0.2, "delta": 3.0},
        ),
    ],
)
def test_rule_loss_equals_trl_builtin_dr_grpo(trainer, rule, params, trl_settings):
    """Same micro-batch: our loss and LoRA gradients equal TRL's loss_type="dr_grpo" (dual clip = TRL's delta)."""
    trainer.rule = build_rule(rule, **params)
    trainer.loss_type = "dr_grpo"
    trainer.epsilon_low, trainer.epsilon_high = trl_settings["epsilon_low"], trl_settings["epsilon_high"]
    trainer.args.delta = trl_settings["delta"]
    inputs = make_inputs(trainer, seed=1)
    trainer._step_stats.reduce()  # this case's metrics only
    ours, ours_grads = loss_and_grad(trainer, type(trainer)._compute_loss, inputs)
    metrics = trainer._step_stats.reduce()
    theirs, their_grads = loss_and_grad(trainer, GRPOTrainer._compute_loss, inputs)
    trainer.args.delta = None
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    for a, b in zip(ours_grads, their_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert any(g.abs().sum() > 0 for g in ours_grads), "the batch must produce a gradient"
    # the batch is off-policy enough for the rule to act
    assert metrics["clip/frac"] > 0


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_trains_through_the_trl_path(trainer, rule):
    """Finite loss, a non-zero gradient and the common metric keys for each of the 14 rules."""
    trainer.rule = build_rule(rule)
    trainer._old_adapter = None
    inputs = make_inputs(trainer, seed=2)
    if trainer.rule.owns_correction:  # the rollout engine's log-probs, which such a rule needs (vLLM rollouts)
        noise = torch.randn(inputs["old_per_token_logps"].shape, generator=torch.Generator().manual_seed(3))
        inputs["sampling_per_token_logps"] = inputs["old_per_token_logps"] + 0.1 * noise.to(trainer.accelerator.device)
    if keeps_old_weights(trainer.rule.needs):  # π_old = a perturbed adapter: the KL or top-K estimate is positive
        # ERC keeps a token's gradient only while the entropy moves by less than 5 %: a smaller perturbation
        scale = 0.005 if "entropy_ratio" in trainer.rule.needs else 0.05
        trainer._old_adapter = {
            name: p.detach() + scale * torch.randn_like(p)
            for name, p in trainer.model.named_parameters()
            if p.requires_grad
        }
    trainer._step_stats.reduce()  # this rule's metrics only: nothing left from an earlier case
    loss, grads = loss_and_grad(trainer, type(trainer)._compute_loss, inputs)
    assert torch.isfinite(loss)
    assert all(torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    metrics = trainer._step_stats.reduce()
    for key in (
        "clip/frac",
        "clip/frac_low",
        "clip/frac_high",
        "ratio/mean",
        "ratio/min",
        "ratio/max",
        "entropy",
    ):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert 0 <= metrics["clip/frac"] <= 1 and metrics["ratio/min"] <= metrics["ratio/mean"] <= metrics["ratio/max"]
    if keeps_old_weights(trainer.rule.needs):  # π_old's kept weights are not π_θ's: the rule's estimate moved
        if "erc/entropy_ratio" in metrics:
            assert metrics["erc/entropy_ratio"] != 1.0
        else:
            assert metrics["kl/estimate_mean"] > 0


def test_the_trl_path_weighs_each_token_by_the_rollout_correction(trainer):
    """With vLLM's log-probs of the sampled tokens in the batch, `_compute_loss` is the uncorrected loss with each
    token's rule loss times the correction's weight (TRL's own correction stays off); without them it refuses."""
    import dataclasses

    from atr_grpo.losses import aggregate
    from atr_grpo.rollout_correction import RolloutCorrection

    trainer.rule = build_rule("atr")
    inputs = make_inputs(trainer, seed=3)
    mask = inputs["completion_mask"]
    noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4)).to(mask.device)
    inputs["sampling_per_token_logps"] = inputs["old_per_token_logps"] + 0.2 * noise
    plain_settings = trainer.loss_settings
    correction = RolloutCorrection("tis", "sequence", 0.8, 1.25)
    trainer.loss_settings = dataclasses.replace(plain_settings, correction=correction)
    try:
        trainer._step_stats.reduce()
        ours, _ = loss_and_grad(trainer, type(trainer)._compute_loss, inputs)
        metrics = trainer._step_stats.reduce()
        with pytest.raises(RuntimeError, match="carries no log-probs from the rollout engine"):
            type(trainer)._compute_loss(trainer, trainer.model, {**inputs, "sampling_per_token_logps": None})
    finally:
        trainer.loss_settings = plain_settings
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attention = torch.cat([inputs["prompt_mask"], mask], 1)
        logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, mask.shape[1])
    old = inputs["old_per_token_logps"]
    weight = correction.weight(old, inputs["sampling_per_token_logps"], mask)
    per_token = trainer.rule(logp, old, inputs["advantages"], mask).loss * weight
    expected = aggregate(per_token, mask, "dr_grpo", trainer.loss_settings.max_completion_length) / 2
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
    assert 0 < metrics["rollout/truncated_frac"] < 1 and metrics["rollout/weight_min"] == pytest.approx(0.8)
    assert trainer.args.vllm_importance_sampling_correction is False


def test_the_token_entropy_the_trl_path_passes_on_is_what_a_second_forward_gives(trainer):
    """ASPO's extra `token_entropy` on TRL's path is the entropy its own forward pass computed, not a second pass:
    the two agree (same positions, same sampling temperature)."""
    from atr_grpo.training.extras import TrainerBatch, token_entropy_from_trainer
    from atr_grpo.training.token_entropy import token_entropy

    inputs = make_inputs(trainer, seed=5)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    steps = inputs["completion_ids"].size(1)
    with torch.no_grad():
        _, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, steps, compute_entropy=True
        )
    batch = TrainerBatch(entropies, False, None, None, None, None, None, steps, trainer.temperature, entropies)
    passed_on = token_entropy_from_trainer(batch)  # no model in the batch: a second pass would fail
    second = token_entropy(trainer.model, ids, mask, steps, trainer.temperature)
    valid = inputs["completion_mask"].bool()
    assert passed_on[valid].std() > 0
    torch.testing.assert_close(passed_on[valid].float(), second[valid], rtol=1e-4, atol=1e-5)
