"""Full-vocabulary KL(π_old(·|s_t) ‖ π_θ(·|s_t)) per completion token: the trainer's value of the extra `full_kl`
(`training.extras`), which the `full_kl` rule needs. It runs the model, so it lives here and not in `clipping/`.

π_old is the policy that generated the rollout. Its whole distribution is recomputed from a snapshot of
the LoRA weights taken at generation time (a few MB, swapped in for one no-grad forward), and the KL is
accumulated over vocabulary chunks with an online log-sum-exp, so no `[B, T, V]` tensor ever exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor


def adapter_snapshot(model: Any) -> dict[str, Tensor]:
    """A detached copy of every trainable parameter (the LoRA weights): π_old at rollout time."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


@contextmanager
def swapped_parameters(model: Any, snapshot: dict[str, Tensor]) -> Iterator[None]:
    """Temporarily replace parameter values by the snapshot's (no copy, restored on exit)."""
    params = dict(model.named_parameters())
    saved = {}
    try:
        for name, value in snapshot.items():
            saved[name] = params[name].data
            params[name].data = value
        yield
    finally:
        for name, data in saved.items():
            params[name].data = data


@torch.no_grad()
def chunked_kl(
    old_hidden: Tensor,
    new_hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    vocab_chunk: int = 8192,
    token_chunk: int = 2048,
) -> Tensor:
    """KL(softmax(h_old W^T / τ) ‖ softmax(h_new W^T / τ)) for each row, `[N, H]` → `[N]`.

    With z = the logits of π_old and d = y - z = (h_new - h_old) W^T / τ their change under π_θ,
    KL = log E_z[e^d] - E_z[d], where E_z averages under softmax(z). Running over vocabulary chunks keeps
    m (running max of z), s = Σ e^(z-m), a = Σ e^(z-m) expm1(d) and c = Σ e^(z-m) d; then
    KL = log1p(a/s) - c/s. Memory is `[token_chunk, vocab_chunk]` at a time.

    Exact for a small step, where the KL (about Var(d)/2, 1e-7 for logits moved by 1e-3) is far below the
    logits themselves: d comes from the difference of the hidden states, not of two rounded logits, and every
    chunk is computed in float32 whatever the model's dtype (bf16 logits are rounded by about 1e-2).
    """
    out = torch.empty(old_hidden.shape[0], dtype=torch.float32, device=old_hidden.device)
    vocab = weight.shape[0]
    for start in range(0, old_hidden.shape[0], token_chunk):
        h_old = old_hidden[start : start + token_chunk].float()
        h_step = new_hidden[start : start + token_chunk].float() - h_old
        n = h_old.shape[0]
        m = torch.full((n,), -torch.inf, device=h_old.device)
        s = torch.zeros(n, device=h_old.device)
        a = torch.zeros(n, device=h_old.device)
        c = torch.zeros(n, device=h_old.device)
        for v0 in range(0, vocab, vocab_chunk):
            w = weight[v0 : v0 + vocab_chunk].float()
            b = None if bias is None else bias[v0 : v0 + vocab_chunk].float()
            z = torch.nn.functional.linear(h_old, w, b) / temperature
            d = torch.nn.functional.linear(h_step, w) / temperature  # the bias cancels
            m_new = torch.maximum(m, z.max(dim=1).values)
            scale = torch.exp(m - m_new)  # rescales what was accumulated under the previous maximum
            e = torch.exp(z - m_new[:, None])
            s = s * scale + e.sum(dim=1)
            a = a * scale + (e * torch.expm1(d)).sum(dim=1)
            c = c * scale + (e * d).sum(dim=1)
            m = m_new
        out[start : start + n] = torch.log1p(a / s) - c / s
    return out.clamp(min=0.0)  # exact KL is ≥ 0; clamp float round-off


def decoder_and_head(model: Any) -> tuple[Any, Any]:
    """The model's decoder stack and its output head (through a PEFT wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def completion_hidden(decoder: Any, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int) -> Tensor:
    """`[B, logits_to_keep, H]`: the last hidden states at the positions that predict the completion tokens."""
    states = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return states[:, -logits_to_keep - 1 : -1, :]  # position i predicts token i + 1


@torch.no_grad()
def full_vocab_kl(
    model: Any,
    snapshot: dict[str, Tensor],
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    temperature: float,
) -> Tensor:
    """`[B, logits_to_keep]` KL(π_old ‖ π_θ) at the positions that predict the completion tokens."""
    decoder, head = decoder_and_head(model)
    new_hidden = completion_hidden(decoder, input_ids, attention_mask, logits_to_keep)
    with swapped_parameters(model, snapshot):
        old_hidden = completion_hidden(decoder, input_ids, attention_mask, logits_to_keep)
    batch, steps, width = new_hidden.shape
    kl = chunked_kl(
        old_hidden.reshape(-1, width),
        new_hidden.reshape(-1, width),
        head.weight,
        getattr(head, "bias", None),
        temperature,
    )
    return kl.view(batch, steps)
