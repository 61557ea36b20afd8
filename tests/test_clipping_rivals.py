"""The sequence-level rules and the rival rules of the registry against their sources: float64 oracles written from
the papers' equations, verl's formulas re-typed from verl 0.9.1's `core_algos.py` (verl is not a dependency), and
TRL's own `GRPOTrainer._compute_loss` where TRL implements the loss; ATR at sequence level against token ATR; and
every rule's independence from the padding layout (Unsloth left-packs rows)."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from test_clipping_math import extras_for, loss_and_grad

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.losses import aggregate

# ---------------------------------------------------------------------------------------------- inputs


def sequence_batch(seed: int = 0, batch: int = 8, steps: int = 12, spread: float = 0.02, dtype=torch.float64):
    """Right-padded rows of lengths 1..steps (none empty), small log-ratios (sequence ratios near GSPO's tiny
    band, some in, some out), a per-sequence advantage of either sign."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g, dtype=dtype) * 3 - 0.05
    logp = old + torch.randn(batch, steps, generator=g, dtype=dtype) * spread
    lengths = torch.randint(1, steps + 1, (batch,), generator=g)
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    advantages = torch.randn(batch, generator=g, dtype=dtype)
    return logp, old, advantages, mask


def left_packed(values: torch.Tensor, mask: torch.Tensor, pad: int = 3):
    """Each row's valid values moved behind a row-dependent left pad (Unsloth's layout), junk under the pad."""
    batch, steps = values.shape
    out = torch.full((batch, steps + pad), 7.0, dtype=values.dtype)
    packed_mask = torch.zeros(batch, steps + pad, dtype=torch.bool)
    for row in range(batch):
        n = int(mask[row].sum())
        start = steps + pad - n - (row % 3)
        out[row, start : start + n] = values[row][mask[row]]
        packed_mask[row, start : start + n] = True
    return out, packed_mask


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# ------------------------------------------------------------------------- TRL's own loss computation
def trl_loss_and_grad(logp, old, advantages, mask, loss_type, level="token", epsilon_low=0.2, epsilon_high=0.2):
    """TRL 1.15's `GRPOTrainer._compute_loss` on given per-token log-probs (its model pass replaced by them)."""
    from trl import GRPOTrainer

    leaf = logp.clone().requires_grad_()
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (leaf, torch.zeros_like(leaf), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=0.0,
        loss_type=loss_type,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        args=SimpleNamespace(delta=None, steps_per_generation=1),
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=logp.shape[1],
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=metrics,
        accelerator=SimpleNamespace(reduce=lambda x, reduction: x, gather=lambda x: x, num_processes=1),
    )
    batch = logp.shape[0]
    inputs = {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.zeros(mask.shape, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.detach(), leaf.grad


def ours(name, params, logp, old, advantages, mask, mode):
    rule = build_rule(name, **params)
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, old, advantages, mask)
    loss = aggregate(out.loss, mask, mode, logp.shape[1])
    loss.backward()
    return loss.detach(), leaf.grad, out


# ------------------------------------------------------------------------------------------------ GSPO
def gspo_oracle(logp, old, advantages, mask, eps_low, eps_high):
    """GSPO's Eq. 5 per sequence in float64, gradient through s_i (the sequence objective, not the token form):
    per-token loss L_i on each valid token, and the gradient of Σ_t loss."""
    leaf = logp.detach().double().clone().requires_grad_()
    log_s = ((leaf - old) * mask).sum(-1) / mask.sum(-1)
    s = torch.exp(log_s)
    a = advantages.double()
    per_sequence = -torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a)
    (per_sequence * mask.sum(-1)).sum().backward()
    return torch.where(mask, per_sequence[:, None], 0.0).detach(), leaf.grad


def test_gspo_matches_the_papers_sequence_objective():
    """Loss: −min(s_i·A_i, clip(s_i)·A_i) on every valid token of sequence i; gradient: the sequence objective's
    (which the GSPO-token form reproduces for a sequence-constant advantage); clip/frac: tokens of clipped
    sequences. Several sequences are clipped on each side."""
    logp, old, advantages, mask = sequence_batch(1, batch=16, spread=0.003)
    rule = build_rule("gspo")
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    want_loss, want_grad = gspo_oracle(logp, old, advantages, mask, 3e-4, 4e-4)
    assert max_error(out.loss, want_loss) < 1e-6 and max_error(grad, want_grad) < 1e-6
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    clipped = ((advantages > 0) & (s > 1 + 4e-4)) | ((advantages < 0) & (s < 1 - 3e-4))
    assert 2 <= int(clipped.sum()) <= 14
    assert out.metrics["clip/frac"] == pytest.approx(float((mask * clipped[:, None]).sum() / mask.sum()))
    assert (grad[clipped] == 0).all() and (grad[~clipped][mask[~clipped]] != 0).all()


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high):
    """verl 0.9.1 `compute_policy_loss_gspo` re-typed, aggregated with its `seq-mean-token-mean`."""
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    seq_mask = torch.sum(response_mask, dim=-1)
    seq_losses = torch.sum(pg_losses * response_mask, dim=-1) / (seq_mask + 1e-8)
    return (seq_losses * (seq_mask > 0)).sum() / (seq_mask > 0).sum()


def test_gspo_matches_verl_and_trl():
    """Under seq_mean (its native aggregation) GSPO's loss and gradient equal verl's `gspo` (seq-mean-token-mean)
    and TRL's `importance_sampling_level="sequence"` with `loss_type="grpo"`, computed by TRL itself."""
    logp, old, advantages, mask = sequence_batch(2, batch=16, spread=0.003, dtype=torch.float32)
    loss, grad, _ = ours("gspo", {}, logp, old, advantages, mask, "seq_mean")
    leaf = logp.clone().requires_grad_()
    verl = verl_gspo(old, leaf, advantages[:, None].expand_as(logp), mask.float(), 3e-4, 4e-4)
    verl.backward()
    assert abs(float(loss - verl)) < 1e-6 and max_error(grad, leaf.grad) < 1e-7
    trl, trl_grad = trl_loss_and_grad(logp, old, advantages, mask, "grpo", "sequence", 3e-4, 4e-4)
    assert abs(float(loss - trl)) < 1e-6 and max_error(grad, trl_grad) < 1e-7
    assert grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------- atr_seq
@pytest.mark.parametrize("reduction", ["mean", "geo", "max"])
@pytest.mark.parametrize("semantics", ["min", "mask"])
def test_atr_seq_on_one_token_sequences_is_exactly_atr(reduction, semantics):
    """With one valid token per row (anywhere in the row) every reduction is that token's KL3, so `atr_seq`
    equals `atr` bit for bit in loss and gradient, planted out-of-region tokens included."""
    g = torch.Generator().manual_seed(3)
    rows, steps = 64, 9
    old = -torch.rand(rows, steps, generator=g) * 3
    logp = old + torch.randn(rows, steps, generator=g) * 0.5
    mask = torch.zeros(rows, steps, dtype=torch.bool)
    mask[torch.arange(rows), torch.randint(0, steps, (rows,), generator=g)] = True
    advantages = torch.randn(rows, generator=g)
    atr, atr_grad = loss_and_grad(build_rule("atr", semantics=semantics), logp, old, advantages, mask)
    seq = build_rule("atr_seq", reduction=reduction, semantics=semantics)
    out, grad = loss_and_grad(seq, logp, old, advantages, mask)
    assert torch.equal(out.loss, atr.loss) and torch.equal(grad, atr_grad)
    assert out.metrics == atr.metrics and atr.metrics["clip/frac"] > 0.1


def atr_seq_oracle(logp, old, advantages, mask, delta, reduction, semantics):
    """Per token (loss, gradient, frozen) from the sequence divergence D_i, in float64 loops."""
    loss, grad = torch.zeros_like(logp), torch.zeros_like(logp)
    frozen_count = 0
    for i in range(logp.shape[0]):
        s = [float(logp[i, t] - old[i, t]) for t in range(logp.shape[1]) if mask[i, t]]
        kl3 = [math.exp(x) - 1 - x for x in s]
        mean_s = sum(s) / len(s)
        divergence = {"mean": sum(kl3) / len(s), "geo": math.exp(mean_s) - 1 - mean_s, "max": max(kl3)}[reduction]
        a = float(advantages[i])
        for t in range(logp.shape[1]):
            if not mask[i, t]:
                continue
            w = math.exp(float(logp[i, t] - old[i, t]))
            frozen = divergence > delta and (semantics == "mask" or w * a > a)
            loss[i, t], grad[i, t] = (-a, 0.0) if frozen else (-w * a, -w * a)
            frozen_count += frozen
    return loss, grad, frozen_count / int(mask.sum())


@pytest.mark.parametrize("reduction", ["mean", "geo", "max"])
@pytest.mark.parametrize("semantics", ["min", "mask"])
def test_atr_seq_matches_its_oracle(reduction, semantics):
    """Each reduction's D_i decides the general operator for every token of the sequence (Eq. 5 per sequence)."""
    logp, old, advantages, mask = sequence_batch(4, batch=24, spread=0.35)
    delta = {"mean": 0.07, "geo": 0.01, "max": 0.3}[reduction]
    rule = build_rule("atr_seq", delta=delta, reduction=reduction, semantics=semantics)
    out, grad = loss_and_grad(rule, logp, old, advantages, mask)
    want_loss, want_grad, frozen = atr_seq_oracle(logp, old, advantages, mask, delta, reduction, semantics)
    assert max_error(out.loss, want_loss) < 1e-5 and max_error(grad, want_grad) < 1e-5
    assert out.metrics["clip/frac"] == pytest.approx(frozen) and 0.05 < frozen < 0.95


def test_one_wild_token_freezes_its_sequence_under_max_not_under_mean():
    """A single token with log w = 2 in a 200-token sequence (KL3 4.39, mean KL3 0.022): `max` freezes the
    sequence (δ = 0.07), `mean` does not; `mask` semantics freezes every token of it."""
    old = torch.full((1, 200), -1.0)
    logp = old.clone()
    logp[0, 17] += 2.0
    mask = torch.ones_like(old, dtype=torch.bool)
    advantages = torch.tensor([1.0])
    for reduction, frac in (("max", 1.0), ("mean", 0.0)):
        out = build_rule("atr_seq", reduction=reduction, semantics="mask")(logp, old, advantages, mask)
        assert out.metrics["clip/frac"] == frac
    out = build_rule("atr_seq", reduction="max")(logp, old, advantages, mask)
    assert out.metrics["clip/frac"] == pytest.approx(1 / 200)  # min semantics: only w > 1 with A > 0 pushes out


# ------------------------------------------------------------------------------------ layout invariance
@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_is_independent_of_the_padding_layout(name):
    """Moving each row's valid tokens behind a left pad (Unsloth's layout, junk under the padding) moves the loss
    and the gradient with the tokens and changes no metric: reductions over a sequence use the mask only."""
    rule = build_rule(name)
    logp, old, advantages, mask = sequence_batch(5, spread=0.3, dtype=torch.float32)
    extras = extras_for(rule, logp)
    want, want_grad = loss_and_grad(rule, logp, old, advantages, mask, **extras)
    packed_logp, packed_mask = left_packed(logp, mask)
    packed_old, _ = left_packed(old, mask)
    if "full_kl" in extras:
        extras["full_kl"] = left_packed(extras["full_kl"], mask)[0]
    if "generator" in extras:
        extras["generator"] = torch.Generator().manual_seed(7)
    out, grad = loss_and_grad(rule, packed_logp, packed_old, advantages, packed_mask, **extras)
    torch.testing.assert_close(out.loss[packed_mask], want.loss[mask], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad[packed_mask], want_grad[mask], rtol=1e-6, atol=1e-7)
    assert (grad[~packed_mask] == 0).all() and (out.loss[~packed_mask] == 0).all()
    assert out.metrics == pytest.approx(want.metrics, rel=1e-5, abs=1e-7)
