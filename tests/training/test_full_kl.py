"""The full-vocabulary KL of the `full_kl` rule (`training.vocab_kl.chunked_kl`): the chunked online log-sum-exp is
the exact KL, and it is computed from float32 logits whatever the model's dtype."""

from __future__ import annotations

import pytest
import torch

from atr_grpo.training.vocab_kl import chunked_kl

VOCAB, WIDTH, TOKENS = 1000, 64, 24


def reference_kl(old_hidden, new_hidden, weight, bias, temperature):
    """KL(softmax(z) ‖ softmax(y)) per row in float64, from the very values the function is given."""
    z = (old_hidden.double() @ weight.double().T + bias.double()) / temperature
    y = (new_hidden.double() @ weight.double().T + bias.double()) / temperature
    return (z.softmax(-1) * (z.log_softmax(-1) - y.log_softmax(-1))).sum(-1)


def inputs(dtype, perturbation):
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(VOCAB, WIDTH, generator=g) / WIDTH**0.5).to(dtype)
    bias = (0.1 * torch.randn(VOCAB, generator=g)).to(dtype)
    old_hidden = (2 * torch.randn(TOKENS, WIDTH, generator=g)).to(dtype)
    # a small policy step: the new hidden states move the logits by about `perturbation`
    step = perturbation * torch.randn(TOKENS, WIDTH, generator=g)
    new_hidden = (old_hidden.double() + step).to(dtype)
    return old_hidden, new_hidden, weight, bias


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_chunked_kl_is_the_exact_kl(temperature):
    """Vocabulary and token chunks that do not divide the sizes give the one-shot KL (float32 round-off)."""
    old_hidden, new_hidden, weight, bias = inputs(torch.float32, 0.3)
    got = chunked_kl(old_hidden, new_hidden, weight, bias, temperature, vocab_chunk=300, token_chunk=7)
    want = reference_kl(old_hidden, new_hidden, weight, bias, temperature)
    assert want.min() > 1e-3  # a KL clearly above round-off
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-7)


def test_bf16_hidden_states_and_head_give_the_float64_kl_of_a_small_step():
    """With a bf16 model (the GPU path) and a step that moves the logits by about 1e-3, the KL (about 1e-7 per
    token) is the float64 KL of the same bf16 values: bf16 logits would round each by about 1e-2, a floor
    orders of magnitude above it."""
    old_hidden, new_hidden, weight, bias = inputs(torch.bfloat16, 1e-3)
    assert not torch.equal(old_hidden, new_hidden)
    got = chunked_kl(old_hidden, new_hidden, weight, bias, vocab_chunk=256, token_chunk=16)
    want = reference_kl(old_hidden, new_hidden, weight, bias, 1.0)
    assert got.dtype == torch.float32
    assert 1e-9 < want.mean() < 1e-5
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-12)
