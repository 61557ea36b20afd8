"""A seeded two-layer Llama and a batch of three 12-token sequences, the first left-padded: for tests of the
trainer's extras computed from a model (entropies, top-K divergences)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 97


def tiny_llama_batch(seed: int = 0) -> tuple[LlamaForCausalLM, torch.Tensor, torch.Tensor]:
    """(model in eval mode, input_ids [3, 12], attention_mask [3, 12] with two padded positions in row 0)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, VOCAB, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # a left-padded prompt
    return model, input_ids, attention_mask
