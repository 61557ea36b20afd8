"""The inputs of the rules' tests: random batches of log-probs (with planted extremes, at sequence level, or with
a rollout engine's log-probs), a rule's extras as the fixtures and the trainer give them, Unsloth's left-packed
layout, and one call of a rule with its gradient."""

from __future__ import annotations

import math

import torch

from atr_grpo.clipping.extras import SAMPLING_LOG_RATIO, fixture_extras
from atr_grpo.training.extras import TRAINER_PROVIDERS, TrainerBatch, trainer_extras


def planted_batch(seed: int = 0, batch: int = 6, steps: int = 40, dtype=torch.float64):
    """Random log-probs with planted extremes: ratios far outside every interval, both advantage signs,
    zero advantages, masked tokens (including a fully masked row)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g, dtype=dtype) * 4 - 0.01
    log_ratio = torch.randn(batch, steps, generator=g, dtype=dtype) * 0.4
    log_ratio[:, :4] = torch.tensor([3.0, -3.0, 0.3, -0.45], dtype=dtype)  # planted: far out, just out
    logp = old + log_ratio
    advantages = torch.randn(batch, generator=g, dtype=dtype)
    advantages[0], advantages[1] = 0.0, -1.5
    mask = torch.rand(batch, steps, generator=g) > 0.2
    mask[2] = False
    return logp, old, advantages, mask


def extras_for(rule, logp):
    return fixture_extras(rule.needs, logp, seed=7, owns_correction=rule.owns_correction)


def on_policy_extras(rule, logp):
    """The rule's extras as the trainer provides them on-policy (π_old = π_θ: e.g. the full KL is 0), and for a rule
    that owns the rollout correction a sampler equal to π_old (log r = 0: the engine's mismatch is not the rule's
    on-policy behaviour)."""
    batch = TrainerBatch(
        like=logp,
        on_policy=True,
        random=lambda: torch.Generator().manual_seed(7),
        model=None,
        old_weights=None,
        input_ids=None,
        attention_mask=None,
        logits_to_keep=logp.shape[1],
        temperature=1.0,
    )
    # an extra read from π_θ alone (the token entropy) needs the model, which these tests lack: its fixture stands in
    from_model = [n for n in rule.needs if TRAINER_PROVIDERS[n].runs_model and not TRAINER_PROVIDERS[n].old_weights]
    extras = trainer_extras([n for n in rule.needs if n not in from_model], batch)
    extras.update(fixture_extras(from_model, logp, seed=7))
    return {**extras, SAMPLING_LOG_RATIO: torch.zeros_like(logp)} if rule.owns_correction else extras


def loss_and_grad(rule, logp, old, advantages, mask, **extras):
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, old, advantages, mask, **extras)
    out.loss.sum().backward()
    return out, leaf.grad


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


MAX_LEN = 12  # the completion budget of `engine_batch` and of the loss that aggregates its rows


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
