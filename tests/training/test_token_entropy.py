"""The per-token entropy the trainer gives ASPO (`training.token_entropy`): the entropy of π_θ's next-token
distribution at each completion position, from float32 logits at the sampling temperature."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_llama import tiny_llama_batch

from atr_grpo.training.token_entropy import chunked_entropy, token_entropy


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_chunked_entropy_is_the_entropy(temperature):
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(500, 32, generator=g) / 4, torch.randn(500, generator=g)
    hidden = 3 * torch.randn(37, 32, generator=g)
    log_p = ((hidden.double() @ weight.double().T + bias.double()) / temperature).log_softmax(-1)
    want = -(log_p.exp() * log_p).sum(-1)
    assert want.std() > 0.1  # tokens of clearly different entropy
    got = chunked_entropy(hidden, weight, bias, temperature, chunk=5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_models_completion_entropy_comes_from_the_positions_that_predict_the_completion():
    model, input_ids, attention_mask = tiny_llama_batch()
    got = token_entropy(model, input_ids, attention_mask, logits_to_keep=5, temperature=0.7)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -6:-1].double() / 0.7
    log_p = logits.log_softmax(-1)
    assert got.shape == (3, 5)
    torch.testing.assert_close(got.double(), -(log_p.exp() * log_p).sum(-1), rtol=1e-5, atol=1e-5)


def test_the_entropy_ratio_divides_the_entropy_under_the_weights_by_that_under_the_snapshot():
    """ERC's extra: (H(π_θ) + 1e-8)/(H(π_old) + 1e-8) at the completion positions, π_old the snapshot swapped in."""
    from atr_grpo.training.token_entropy import entropy_ratio
    from atr_grpo.training.vocab_kl import adapter_snapshot, swapped_parameters

    model, input_ids, attention_mask = tiny_llama_batch()
    snapshot = {n: v + 0.2 * torch.randn_like(v) for n, v in adapter_snapshot(model).items() if "lm_head" not in n}
    got = entropy_ratio(model, snapshot, input_ids, attention_mask, logits_to_keep=5, temperature=0.7)
    new = token_entropy(model, input_ids, attention_mask, 5, 0.7)
    with swapped_parameters(model, snapshot):
        old = token_entropy(model, input_ids, attention_mask, 5, 0.7)
    assert got.shape == (3, 5) and (got - 1).abs().max() > 1e-3  # the snapshot moved the entropies
    torch.testing.assert_close(got, (new + 1e-8) / (old + 1e-8))
    torch.testing.assert_close(
        entropy_ratio(model, adapter_snapshot(model), input_ids, attention_mask, 5, 0.7), torch.ones(3, 5)
    )
