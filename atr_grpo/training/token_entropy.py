"""Per-token entropy of π_θ(·|s_t) over the vocabulary: the trainer's value of the extra `token_entropy`
(`training.extras`), which ASPO's entropy-dependent ε needs, where the trainer's own forward pass did not compute
it (TRL's path does, and passes it on); and the ratio H(π_θ)/H(π_old), the extra `entropy_ratio` that ERC needs, with
π_old the LoRA snapshot taken at rollout (`vocab_kl.adapter_snapshot`). They run the model, so they live here and
not in `clipping/`.

One no-grad forward of the decoder gives the hidden states that predict the completion tokens; the logits are
formed a chunk of tokens at a time, in float32, at the sampling temperature, so no `[B, T, V]` tensor exists.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.training.vocab_kl import completion_hidden, decoder_and_head, swapped_parameters


@torch.no_grad()
def chunked_entropy(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float, chunk: int = 256
) -> Tensor:
    """H(softmax(h Wᵀ / τ)) for each row of `hidden`, `[N, H]` → `[N]` float32."""
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    w = weight.float()
    b = None if bias is None else bias.float()
    for start in range(0, hidden.shape[0], chunk):
        logits = torch.nn.functional.linear(hidden[start : start + chunk].float(), w, b) / temperature
        log_p = torch.log_softmax(logits, dim=-1)
        out[start : start + chunk] = -(log_p.exp() * log_p).sum(dim=-1)
    return out


@torch.no_grad()
def token_entropy(
    model: Any, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int, temperature: float
) -> Tensor:
    """`[B, logits_to_keep]` entropy of π_θ at the positions that predict the completion tokens."""
    decoder, head = decoder_and_head(model)
    states = completion_hidden(decoder, input_ids, attention_mask, logits_to_keep)
    batch, steps, width = states.shape
    entropy = chunked_entropy(states.reshape(-1, width), head.weight, getattr(head, "bias", None), temperature)
    return entropy.view(batch, steps)


@torch.no_grad()
def entropy_ratio(
    model: Any,
    snapshot: dict[str, Tensor],
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    temperature: float,
) -> Tensor:
    """`[B, logits_to_keep]` (H(π_θ) + 1e-8)/(H(π_old) + 1e-8) at the positions that predict the completion tokens
    (ERC's ratio, Kwai-Klear/ERC `compute_policy_loss_grpo_erc`); π_old is `snapshot` swapped into the model. The
    output head is shared (LoRA adapts the decoder), as for the full-vocabulary KL."""
    decoder, head = decoder_and_head(model)
    new_hidden = completion_hidden(decoder, input_ids, attention_mask, logits_to_keep)
    with swapped_parameters(model, snapshot):
        old_hidden = completion_hidden(decoder, input_ids, attention_mask, logits_to_keep)
    batch, steps, width = new_hidden.shape
    bias = getattr(head, "bias", None)
    new = chunked_entropy(new_hidden.reshape(-1, width), head.weight, bias, temperature)
    old = chunked_entropy(old_hidden.reshape(-1, width), head.weight, bias, temperature)
    return ((new + 1e-8) / (old + 1e-8)).view(batch, steps)
