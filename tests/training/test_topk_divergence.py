"""DPPO's top-K estimates the trainer gives `dppo_topk_tv` and `dppo_topk_kl` (`training.topk_divergence`): TV and
KL(π_old ‖ π_θ) over π_old's top-K tokens, the sampled token and the rest of the vocabulary as one category."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tiny_llama import tiny_llama_batch

from atr_grpo.clipping.dppo import binary_kl
from atr_grpo.training.topk_divergence import topk_divergence, topk_divergences
from atr_grpo.training.vocab_kl import adapter_snapshot


def distributions(seed: int = 0, rows: int = 9, vocab: int = 50):
    g = torch.Generator().manual_seed(seed)
    old = (torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 2).log_softmax(-1)
    new = (old + 0.3 * torch.randn(rows, vocab, generator=g, dtype=torch.float64)).log_softmax(-1)
    sampled = torch.randint(0, vocab, (rows,), generator=g)
    sampled[0] = old[0].argmax()  # a sampled token among the top K counts once
    return old, new, sampled


def by_the_definition(old, new, sampled, k):
    """TV and KL written from the categories: the set S = top-K(π_old) ∪ {y}, then one category for the rest."""
    tvs, kls = [], []
    for row in range(old.shape[0]):
        chosen = set(old[row].topk(k).indices.tolist()) | {int(sampled[row])} if k else {int(sampled[row])}
        q = [float(old[row, v].exp()) for v in chosen] + [1 - sum(float(old[row, v].exp()) for v in chosen)]
        p = [float(new[row, v].exp()) for v in chosen] + [1 - sum(float(new[row, v].exp()) for v in chosen)]
        tvs.append(0.5 * sum(abs(a - b) for a, b in zip(p, q)))
        smoothing = [0.0] * len(chosen) + [1e-8]  # verl's, on the rest only
        kls.append(sum(b * math.log((b + s) / (a + s)) for a, b, s in zip(p, q, smoothing)))
    return torch.tensor(tvs, dtype=torch.float64), torch.tensor(kls, dtype=torch.float64)


@pytest.mark.parametrize("k", [1, 5, 20])
def test_the_topk_estimates_are_tv_and_kl_over_their_categories(k):
    old, new, sampled = distributions()
    tv, kl = topk_divergences(old, new, sampled, k)
    want_tv, want_kl = by_the_definition(old, new, sampled, k)
    torch.testing.assert_close(tv, want_tv, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(kl, want_kl, rtol=1e-6, atol=1e-9)


def test_k_zero_gives_dppos_binary_estimates_and_the_whole_vocabulary_the_exact_ones():
    old, new, sampled = distributions(1)
    tv, kl = topk_divergences(old, new, sampled, 0)
    q, p = old.gather(-1, sampled[:, None])[:, 0], new.gather(-1, sampled[:, None])[:, 0]
    torch.testing.assert_close(tv, (p.exp() - q.exp()).abs())
    torch.testing.assert_close(kl, binary_kl(q, p))
    tv, kl = topk_divergences(old, new, sampled, old.shape[-1])
    torch.testing.assert_close(tv, 0.5 * (new.exp() - old.exp()).abs().sum(-1))
    torch.testing.assert_close(kl, (old.exp() * (old - new)).sum(-1), rtol=1e-6, atol=1e-7)
    tv_small, _ = topk_divergences(old, new, sampled, 3)
    assert (tv_small <= tv + 1e-12).all() and (tv_small >= topk_divergences(old, new, sampled, 0)[0] - 1e-12).all()


def test_a_models_topk_estimates_compare_its_snapshot_with_its_weights_at_the_completion_positions():
    model, input_ids, attention_mask = tiny_llama_batch()
    # π_old differs in the decoder (where LoRA adapts); the output head is shared, as for the full-vocabulary KL
    snapshot = {n: v + 0.05 * torch.randn_like(v) for n, v in adapter_snapshot(model).items() if "lm_head" not in n}
    tv, kl = topk_divergence(model, snapshot, input_ids, attention_mask, 5, 0.7, k=4, chunk=4)
    with torch.no_grad():
        new = (model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -6:-1].double() / 0.7).log_softmax(
            -1
        )
        current = adapter_snapshot(model)
        for name, param in model.named_parameters():
            param.data = snapshot.get(name, param.data)
        old = (model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -6:-1].double() / 0.7).log_softmax(
            -1
        )
        for name, param in model.named_parameters():
            param.data = current[name]
    want_tv, want_kl = by_the_definition(old.reshape(15, 97), new.reshape(15, 97), input_ids[:, -5:].reshape(-1), 4)
    assert tv.shape == (3, 5) and (tv > 0).all()
    torch.testing.assert_close(tv.double().reshape(-1), want_tv, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(kl.double().reshape(-1), want_kl, rtol=1e-4, atol=1e-5)
