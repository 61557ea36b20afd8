"""What a GRPO trainer does with completions that ran out of tokens (`trainer.truncation`, `atr_grpo.truncation`):
it checks that it stops on the tokens the rule reads, marks each completion of a rollout batch, masks the loss of
truncated ones under `mask`, and records the truncated fraction of every micro-batch it trains on and its
completions by finish reason, as the evaluation names them (`length`, `stop`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from atr_grpo.truncation import Truncation

if TYPE_CHECKING:
    from atr_grpo.training.step_stats import StepStats


class TruncationMixin:
    """Part of `RuleTrainerMixin`, in front of a `GRPOTrainer`; `truncation` and `_step_stats` are set there."""

    truncation: Truncation | None
    _step_stats: StepStats
    model: Any

    def require_truncation(self) -> Truncation:
        if self.truncation is None:
            raise RuntimeError("this trainer generates completions but was built without a truncation rule")
        return self.truncation

    def check_stop_ids(self) -> None:
        """After `GRPOTrainer.__init__`: the trainer stops generating on the ids the truncation rule reads."""
        truncation = self.require_truncation()
        ours, theirs = set(truncation.stop_ids), set(getattr(self, "eos_token_ids", truncation.stop_ids))
        if ours != theirs:
            raise RuntimeError(
                f"the trainer stops completions on token ids {sorted(theirs)}, the truncation rule on {sorted(ours)}: "
                "rewards would call finished completions truncated"
            )

    def apply_truncation(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Mark each completion of a scored rollout batch as truncated or not (`batch["truncated"]`, `[B]`), by
        `atr_grpo.truncation`, and under `trainer.truncation=mask` drop the truncated ones' tokens from the loss.

        `completion_mask` covers each completion up to its first end token (TRL's own masking is off) and stays as it
        is: the model still reads a masked completion. The loss mask is `tool_mask`, which both paths multiply into
        the loss (TRL's `_compute_loss`, Unsloth's `compute_loss`). Zeroing `completion_mask` instead, as TRL's
        `mask_truncated_completions` does, would leave a micro-batch of only truncated completions without a gradient.
        """
        truncation = self.require_truncation()
        ids, mask = batch["completion_ids"], batch["completion_mask"]
        lengths = mask.sum(dim=1).tolist()
        rows = ids.tolist()
        flags = [truncation.truncated(row[: int(n)]) for row, n in zip(rows, lengths, strict=True)]
        truncated = torch.tensor(flags, dtype=torch.bool, device=mask.device)
        batch["truncated"] = truncated
        if truncation.masks_loss:
            keep = (~truncated).unsqueeze(1).to(mask.dtype).expand_as(mask)
            existing = batch.get("tool_mask")
            batch["tool_mask"] = keep.clone() if existing is None else existing * keep
        return batch

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """Both paths' loss; during training, the micro-batch's truncated fraction and its completions by finish
        reason (`completions/finish_length`: ran out of tokens; `completions/finish_stop`: ended at a stop token,
        summed over the step's micro-batches and processes) are recorded first."""
        if self.model.training and "truncated" in inputs:
            truncated = inputs["truncated"]
            length = int(truncated.sum())
            self._step_stats.add({"completions/truncated_frac": float(truncated.float().mean())}, truncated.numel())
            finished = {"completions/finish_length": length, "completions/finish_stop": truncated.numel() - length}
            self._step_stats.add(finished, truncated.numel())
        return super().compute_loss(model, inputs, *args, **kwargs)
