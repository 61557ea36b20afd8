"""DPPO's top-K estimates of the divergence between π_old(·|s_t) and π_θ(·|s_t): the trainer's values of the extras
`topk_tv` and `topk_kl` (`training.extras`), which `dppo_topk_tv` and `dppo_topk_kl` need. They run the model, so
they live here and not in `clipping/`.

The categories are π_old's K most likely tokens, the sampled token y_t, and one category for the rest of the
vocabulary. With S that set, q and p the two policies, Q = Σ_{v∈S} q_v and P = Σ_{v∈S} p_v:

    TV = ½·(Σ_{v∈S} |p_v − q_v| + |P − Q|)
    KL = Σ_{v∈S} q_v·log(q_v/p_v) + (1 − Q)·log((1 − Q + 1e-8)/(1 − P + 1e-8))    (KL(π_old ‖ π_θ), verl's smoothing)

With K = 0 they are DPPO's binary estimates; with K the vocabulary's size, the exact TV and KL. π_old is the LoRA
snapshot taken at rollout (`vocab_kl.adapter_snapshot`), as for the full-vocabulary KL; both distributions are
float32 at the sampling temperature, a chunk of tokens at a time. The output head is shared (LoRA adapts the
decoder), as for the full-vocabulary KL.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping.dppo import BINARY_KL_SMOOTHING
from atr_grpo.training.vocab_kl import completion_hidden, decoder_and_head, swapped_parameters


def topk_divergences(old_logp: Tensor, new_logp: Tensor, sampled: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(TV, KL) over π_old's top `k` tokens, the sampled token and the rest, from `[N, V]` log-probs and `[N]` ids."""
    index = torch.cat([old_logp.topk(k, dim=-1).indices, sampled[:, None]], dim=-1)  # [N, k + 1]
    # the sampled token counts once: its own column is dropped where it is already among the top k
    once = torch.ones_like(index, dtype=old_logp.dtype)
    once[:, -1] = (index[:, :-1] != sampled[:, None]).all(dim=-1).to(old_logp.dtype)
    old_lp, new_lp = old_logp.gather(-1, index), new_logp.gather(-1, index)
    old_p, new_p = old_lp.exp(), new_lp.exp()
    old_rest = (1 - (once * old_p).sum(-1)).clamp(min=0.0)
    new_rest = (1 - (once * new_p).sum(-1)).clamp(min=0.0)
    tv = 0.5 * ((once * (new_p - old_p).abs()).sum(-1) + (new_rest - old_rest).abs())
    rest = torch.log((old_rest + BINARY_KL_SMOOTHING) / (new_rest + BINARY_KL_SMOOTHING))
    kl = (once * old_p * (old_lp - new_lp)).sum(-1) + old_rest * rest
    return tv, kl.clamp(min=0.0)


@torch.no_grad()
def topk_divergence(
    model: Any,
    snapshot: dict[str, Tensor],
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    temperature: float,
    k: int,
    chunk: int = 256,
) -> tuple[Tensor, Tensor]:
    """`[B, logits_to_keep]` (TV, KL) at the positions that predict the completion tokens."""
    decoder, head = decoder_and_head(model)
    new_hidden = completion_hidden(decoder, input_ids, attention_mask, logits_to_keep)
    with swapped_parameters(model, snapshot):
        old_hidden = completion_hidden(decoder, input_ids, attention_mask, logits_to_keep)
    batch, steps, width = new_hidden.shape
    sampled = input_ids[:, -logits_to_keep:].reshape(-1)
    old_hidden, new_hidden = old_hidden.reshape(-1, width), new_hidden.reshape(-1, width)
    weight = head.weight.float()
    bias = getattr(head, "bias", None)
    bias = None if bias is None else bias.float()
    tv = torch.empty(batch * steps, dtype=torch.float32, device=new_hidden.device)
    kl = torch.empty_like(tv)
    for start in range(0, batch * steps, chunk):
        rows = slice(start, start + chunk)
        old = (torch.nn.functional.linear(old_hidden[rows].float(), weight, bias) / temperature).log_softmax(-1)
        new = (torch.nn.functional.linear(new_hidden[rows].float(), weight, bias) / temperature).log_softmax(-1)
        tv[rows], kl[rows] = topk_divergences(old, new, sampled[rows], min(k, old.shape[-1]))
    return tv.view(batch, steps), kl.view(batch, steps)
