"""Does verl compute every atr_grpo rule as atr_grpo does? Loss and gradient, through verl's own actor loss.

    .venv-verl/bin/python -m atr_grpo.integrations.verl_check    # a Markdown table; exit status 1 on any gap

For each rule of the registry and each verl `loss_agg_mode` that has a counterpart here, one random batch
(right-padded completions of different lengths, one of them empty, per-sequence advantages of both signs,
ratios spread so that every rule clips) goes two ways:

* verl: `verl.workers.utils.losses.ppo_loss`, the function verl's actor workers call, which picks the loss from
  `actor.policy_loss.loss_mode`, fills the global batch sizes, calls the plugin's loss and verl's `agg_loss`;
  the log-probs enter as verl's packed model output (prompt and response tokens of each sequence, unpadded);
* here: the rule at its defaults (`rule_at_defaults`) on the `[B, T]` tensors, then `atr_grpo.losses.aggregate`
  with the mapped mode.

Both are differentiated by autograd with respect to the same log-prob tensor. Rules that verl cannot run are
reported as refused, with the reason.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping import RULES, ClipRule, rule_at_defaults
from atr_grpo.clipping.extras import VerlCall, verl_extras
from atr_grpo.integrations import verl as plugin
from atr_grpo.losses import aggregate

# float32 rounding of the same sums taken in a different order (verl divides by B, then by L)
LOSS_TOLERANCE = 1e-6
GRAD_TOLERANCE = 1e-7
PROMPT_LENGTH = 3


@dataclass
class TokenInputs:
    """One policy-loss batch, `[B, T]` each; `logp` is the leaf both losses are differentiated against."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor


def random_inputs(seed: int = 0, batch: int = 16, length: int = 32) -> TokenInputs:
    """Right-padded completions of lengths 1..T plus one empty one, log-ratios ~ N(0, 0.3²), and per-row
    advantages of alternating sign, so that both sides of every trust region are reached."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    lengths[0], lengths[-1] = length, 0  # a full completion and an empty one (masked entirely)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    logp = -2.0 * torch.rand(batch, length, generator=generator)
    old_logp = logp + 0.3 * torch.randn(batch, length, generator=generator)
    signs = 1.0 - 2.0 * (torch.arange(batch) % 2)
    advantages = (signs * (0.5 + torch.rand(batch, generator=generator))).unsqueeze(1).expand(batch, length)
    return TokenInputs(logp.requires_grad_(), old_logp, advantages.contiguous(), mask)


def actor_config(loss_mode: str, loss_agg_mode: str, length: int, seed: int = 0, **params: Any) -> Any:
    """verl's actor config selecting `loss_mode`, with Dr.GRPO's L = `length` and rule parameters `params`."""
    from verl.workers.config import ActorConfig

    policy_loss = plugin.ATRPolicyLossConfig(loss_mode=loss_mode, **params)
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=length,
        data_loader_seed=seed,
        policy_loss=policy_loss,
    )


def verl_actor_loss(
    config: Any,
    inputs: TokenInputs,
    rollout_is_weights: Tensor | None = None,
    global_tokens: int | None = None,
    global_sequences: int | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """The loss and metrics of verl's actor (`ppo_loss`) on `inputs` as one micro-batch on one rank.

    The global mini-batch (its number of valid tokens and of sequences) defaults to `inputs` itself.
    """
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    batch, length = inputs.mask.shape
    lengths = inputs.mask.sum(-1)
    # verl's packed model output: token j of a sequence is predicted at position j - 1 (PROMPT_LENGTH - 1 + j
    # for response token j); the positions that predict nothing of the response hold filler values
    pieces = []
    for row in range(batch):
        pieces += [torch.zeros(PROMPT_LENGTH - 1), inputs.logp[row, : lengths[row]], torch.zeros(1)]
    attention = torch.cat([torch.ones(batch, PROMPT_LENGTH, dtype=torch.long), inputs.mask.long()], dim=1)
    data = TensorDict(
        {
            "prompts": torch.ones(batch, PROMPT_LENGTH, dtype=torch.long),
            "responses": torch.ones(batch, length, dtype=torch.long),
            "attention_mask": attention,
            "response_mask": inputs.mask.long(),
            "old_log_probs": inputs.old_logp,
            "advantages": inputs.advantages,
        },
        batch_size=[batch],
    )
    if rollout_is_weights is not None:
        data["rollout_is_weights"] = rollout_is_weights
    tokens = int(inputs.mask.sum()) if global_tokens is None else global_tokens
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=tokens, global_batch_size=global_sequences or batch)
    return ppo_loss(config, {"log_probs": torch.cat(pieces)}, data)


def reference_loss(rule: ClipRule, loss_agg_mode: str, inputs: TokenInputs, extras: dict[str, Any]) -> Tensor:
    """The same loss computed here: the rule, then our aggregation for verl's mode."""
    out = rule(inputs.logp, inputs.old_logp, inputs.advantages, inputs.mask, **extras)
    length = inputs.mask.shape[1]
    return aggregate(out.loss, inputs.mask, plugin.VERL_AGGREGATIONS[loss_agg_mode], max_completion_length=length)


@dataclass
class Gaps:
    """How far verl's loss and gradient are from ours, and the size of ours (to show the check is not vacuous)."""

    loss: float  # |Δloss|
    grad: float  # max |Δgrad| over tokens
    loss_scale: float  # |loss|
    grad_scale: float  # max |grad|

    def within_tolerance(self) -> bool:
        return self.loss <= LOSS_TOLERANCE and self.grad <= GRAD_TOLERANCE


def gaps(rule_name: str, loss_agg_mode: str, seed: int = 0) -> Gaps:
    """Loss and gradient of verl's actor loss against ours, for one rule at its defaults."""
    inputs = random_inputs(seed)
    config = actor_config(plugin.loss_mode_of(rule_name), loss_agg_mode, inputs.mask.shape[1], seed)
    plugin.reset_key_generators()
    verl_loss, _ = verl_actor_loss(config, inputs)
    (verl_grad,) = torch.autograd.grad(verl_loss, inputs.logp)
    rule = rule_at_defaults(rule_name)
    stream = plugin.process_stream(seed, rank=0)  # a fresh stream of what verl's call drew from
    extras = verl_extras(rule.needs, VerlCall(like=inputs.logp, random=lambda: stream))
    ours = reference_loss(rule, loss_agg_mode, inputs, extras)
    (our_grad,) = torch.autograd.grad(ours, inputs.logp)
    return Gaps(
        loss=(verl_loss - ours).abs().item(),
        grad=(verl_grad - our_grad).abs().max().item(),
        loss_scale=ours.abs().item(),
        grad_scale=our_grad.abs().max().item(),
    )


def main() -> int:
    print("| rule | " + " | ".join(f"{mode} Δloss / Δgrad" for mode in plugin.VERL_AGGREGATIONS) + " |")
    print("|---|" + "---|" * len(plugin.VERL_AGGREGATIONS))
    failed = False
    refused = {name: plugin.refusal(RULES[name]) for name in sorted(RULES) if plugin.refusal(RULES[name])}
    for name in sorted(RULES):
        if name in refused:
            print(f"| {name} | " + " | ".join(["refused"] * len(plugin.VERL_AGGREGATIONS)) + " |")
            continue
        cells = []
        for mode in plugin.VERL_AGGREGATIONS:
            gap = gaps(name, mode)
            failed |= not gap.within_tolerance()
            cells.append(f"{gap.loss:.1e} / {gap.grad:.1e}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for reason in refused.values():
        print(f"\n{reason}")
    print(f"\ntolerance: |Δloss| ≤ {LOSS_TOLERANCE:g}, max |Δgrad| ≤ {GRAD_TOLERANCE:g}: {'FAIL' if failed else 'ok'}")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
