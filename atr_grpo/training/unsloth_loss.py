"""The registered rule inside Unsloth's compiled, memory-efficient GRPO loss.

Importing `unsloth` on a GPU machine rewrites TRL's `GRPOTrainer` into a generated module whose
`compute_loss` calls `grpo_accumulated_loss` (chunked log-probs from hidden states, padding left-packed),
which calls `UnslothEfficientGRPO.apply`, which runs `grpo_compute_loss` under `torch.func.grad_and_value`
and `torch.compile(fullgraph=True)`. All three names are globals of that generated module, so the rule
goes in by replacing them there (`install_rule`):

- `grpo_compute_loss`  → `make_grpo_compute_loss(rule, settings)`: `losses.grpo_loss`, the composition the
  TRL path calls too, on the tensors zoo hands it (the rollout correction's weight from zoo's
  `sampling_per_token_logps`, the δ in force as a tensor extra);
- `grpo_accumulated_loss` → a wrapper that adds the rule's extras (`encode_extras`: per-token extras travel
  in a layout-independent compact form) and, afterwards, records the step's metrics from the exact tensors
  the compiled loss saw (`RuleTrainerMixin.record_loss`, as on the TRL path);
- `UnslothEfficientGRPO` → a stand-in that records those tensors by argument name, then calls the real one.

Nothing here imports unsloth: the functions are plain torch and are tested on CPU inside unsloth_zoo's
real `UnslothEfficientGRPO` (tests/training/test_unsloth_path.py). Building the GPU trainer is `unsloth_trainer`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, MutableMapping
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping import ClipRule
from atr_grpo.clipping.base import LOG_RATIO_LIMIT
from atr_grpo.losses import LossSettings, grpo_loss

# the rule's extras travel through zoo's loss kwargs (zoo passes unknown kwargs on): per-token `[B, T]` extras
# compacted under the first prefix, every other extra (per-sequence `[B, 1]`, 0-d seeds and δ) as it is under the second
TOKEN_EXTRA_PREFIX = "atr_token_extra__"
EXTRA_PREFIX = "atr_extra__"
# the loss globals of Unsloth's generated trainer module that `install_rule` replaces
LOSS_GLOBALS = ("grpo_compute_loss", "grpo_accumulated_loss", "UnslothEfficientGRPO")
# the arguments of `UnslothEfficientGRPO.forward` the recorder reads, by name (unsloth_zoo 2026.10.9)
RECORDED_ARGUMENTS = ("_new_logps", "_old_logps", "_ref_logps", "_sampling_per_token_logps", "_mask", "_advantages")


# ----------------------------------------------------------------------------------- layout conversion
def valid_index(mask: Tensor) -> Tensor:
    """`[B, T]` index of each token among its row's valid tokens (-1 before the first valid one)."""
    return torch.cumsum(mask.long(), dim=1) - 1


def compact_valid(values: Tensor, mask: Tensor) -> Tensor:
    """Move each row's valid values to the front, in order: `[B, T]` → `[B, T]` (rest 0).

    TRL's batches are right-padded, Unsloth's loss sees them left-packed; the i-th valid token of a row
    is the same token in both, so per-token extras travel in this compact form.
    """
    batch, steps = values.shape
    index = torch.where(mask.bool(), valid_index(mask), steps)  # invalid tokens go to a spill column
    out = values.new_zeros(batch, steps + 1)
    out.scatter_(1, index, values)
    return out[:, :steps]


def expand_compact(compact: Tensor, mask: Tensor) -> Tensor:
    """Inverse of `compact_valid` into the layout of `mask` (`[B, T']`, any T'); pure tensor code."""
    index = valid_index(mask).clamp(min=0, max=compact.shape[1] - 1)
    return torch.where(mask.bool(), torch.gather(compact, 1, index), 0.0)


def encode_extras(extras: dict[str, Tensor], mask: Tensor) -> dict[str, Tensor]:
    """The rule's extras as loss kwargs: per-token tensors (the shape of `mask`, `[B, T]`) compacted, the others
    (per-sequence `[B, 1]`, 0-d seeds) as they are: repacking moves tokens within a row, never rows."""
    encoded = {}
    for name, value in extras.items():
        if value.shape == mask.shape:
            encoded[TOKEN_EXTRA_PREFIX + name] = compact_valid(value.float(), mask)
        else:
            encoded[EXTRA_PREFIX + name] = value
    return encoded


def decode_extras(kwargs: dict[str, Any], mask: Tensor) -> dict[str, Tensor]:
    """Inverse of `encode_extras`, into the layout of `mask` (zoo's left-packed one); pure tensor code."""
    out = {}
    for key, value in kwargs.items():
        if value is None:
            continue
        if key.startswith(TOKEN_EXTRA_PREFIX):
            out[key[len(TOKEN_EXTRA_PREFIX) :]] = expand_compact(value, mask)
        elif key.startswith(EXTRA_PREFIX):
            out[key[len(EXTRA_PREFIX) :]] = value
    return out


# ------------------------------------------------------------------------------- the compiled loss
def make_grpo_compute_loss(rule: ClipRule, settings: LossSettings, on_policy: bool = False) -> Callable[..., tuple]:
    """A drop-in for unsloth_zoo's `grpo_compute_loss` whose loss is `losses.grpo_loss` with `rule`.

    `on_policy` (every update is the first on its rollout): π_old is π_θ's own detached log-probs, w ≡ 1, as on
    the TRL path, which skips π_old there. With vLLM rollouts Unsloth needs TRL's correction switched on, which
    makes TRL recompute π_old in a separate no-grad pass; that copy differs from π_θ by numerical noise only,
    and the rule would act on it.

    Returns `(loss, completion_length, mean_kl, delta, flat_is_ratio, coef_1, mask)` like zoo's. The loss is
    already normalised (Dr.GRPO constant, ÷ gradient-accumulation steps): Unsloth's backward returns the
    gradient computed here and ignores the upstream one. With the rollout engine's log-probs, `delta` is
    |log π_old − log π_rollout| and `flat_is_ratio` the correction weight ρ (1 without a correction), both `[B, T]`
    and 0 on padding, which Unsloth logs as `sampling/*` (not recorded: `run_logger`). Pure tensor code: it runs under
    `torch.func.grad_and_value` and a fullgraph compile.
    """

    def grpo_compute_loss(
        ref: Tensor | None,
        new: Tensor,
        old: Tensor | None,
        sampling_per_token_logps: Tensor | None,
        input_ids: Tensor,
        mask: Tensor,
        beta: float,
        advantages: Tensor,
        **kwargs: Any,
    ) -> tuple:
        valid = mask.bool()
        maskf = mask.to(torch.float32)
        new = torch.where(valid, new, 0.0)  # packed rows leave garbage (even NaN) under padding
        result = grpo_loss(
            rule,
            new,
            new.detach() if old is None or on_policy else old,  # TRL skips π_old when on-policy: w ≡ 1
            advantages,
            mask,
            settings,
            ref_logp=ref,
            sampling_logp=sampling_per_token_logps,
            gradient_accumulation_steps=kwargs.get("current_gradient_accumulation_steps", 1),
            extras=decode_extras(kwargs, valid),
        )
        mean_kl = maskf.new_zeros(())
        if result.kl_ref is not None:
            mean_kl = (result.kl_ref * maskf).sum() / maskf.sum().clamp(min=1.0)
        coef_1 = torch.exp(result.batch.log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).detach()
        completion_length = maskf.sum(1).mean()
        if sampling_per_token_logps is None:  # no rollout log-probs: zoo expects empty tensors here
            empty = maskf.new_zeros(0)
            return result.loss, completion_length, mean_kl, empty, empty, coef_1, maskf
        gap = torch.nan_to_num((result.batch.old_logp - sampling_per_token_logps).abs(), nan=0.0) * maskf
        kept = result.batch.mask.to(torch.float32)  # a rollout rejection's rejected tokens weigh 0
        weight = kept if result.correction_weight is None else result.correction_weight.expand_as(maskf) * kept
        return result.loss, completion_length, mean_kl, gap.detach(), weight.detach(), coef_1, maskf

    return grpo_compute_loss


# ------------------------------------------------------------------------- extras and metrics (eager)
class _Recorder:
    """Stands in for `UnslothEfficientGRPO`: records what the compiled loss is given, then calls it."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.signature = inspect.signature(real.forward)  # forward(ctx, ...): a placeholder binds ctx
        missing = [name for name in (*RECORDED_ARGUMENTS, "extra_kwargs") if name not in self.signature.parameters]
        if missing:
            raise RuntimeError(
                f"unsloth_zoo's UnslothEfficientGRPO.forward has no argument {missing}; is unsloth_zoo 2026.10.9 used?"
            )
        self.last: dict[str, Any] | None = None

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.signature.bind(None, *args, **kwargs).arguments
        self.last = {name: bound.get(name) for name in RECORDED_ARGUMENTS}
        self.last["extra_kwargs"] = bound.get("extra_kwargs") or {}
        return self.real.apply(*args, **kwargs)


def recorded_loss(rule: ClipRule, settings: LossSettings, record: dict[str, Any], on_policy: bool = False) -> Any:
    """`grpo_loss` again, eagerly and without gradient, on the tensors the compiled loss saw (its metrics)."""
    new, mask = record["_new_logps"].detach(), record["_mask"]
    valid = mask.bool()
    new = torch.where(valid, new, 0.0)
    old = record["_old_logps"]
    with torch.no_grad():
        return grpo_loss(
            rule,
            new,
            new if old is None or on_policy else old.detach(),
            record["_advantages"],
            mask,
            settings,
            ref_logp=record["_ref_logps"],
            sampling_logp=record["_sampling_per_token_logps"],
            extras=decode_extras(record["extra_kwargs"], valid),
        )


def make_accumulated_loss(
    original: Callable[..., tuple], recorder: _Recorder, on_policy: bool = False
) -> Callable[..., tuple]:
    """Wrap zoo's `grpo_accumulated_loss`: add the rule's extras, then record the step's metrics."""

    @functools.wraps(original)  # Unsloth inspects this function's signature and source
    def grpo_accumulated_loss(trainer: Any, *args: Any, **kwargs: Any) -> tuple:
        if not hasattr(trainer, "rule_extras"):  # a trainer that is not ours: leave Unsloth alone
            return original(trainer, *args, **kwargs)
        bound = inspect.signature(original).bind_partial(trainer, *args, **kwargs).arguments
        bound.update(bound.pop("kwargs", {}))
        trainer.check_sampling_logp(bound.get("sampling_per_token_logps"))
        completion_mask = bound["completion_mask"]
        if bound.get("tool_mask") is not None:
            completion_mask = completion_mask * bound["tool_mask"]
        extras = trainer.rule_extras(
            trainer.model,
            bound["input_ids"],
            bound["attention_mask"],
            bound["logits_to_keep"],
            completion_mask.float(),
            bound.get("old_logps") is not None and not on_policy,
        )
        kwargs.update(encode_extras(extras, completion_mask))
        recorder.last = None
        outputs = original(trainer, *args, **kwargs)
        if recorder.last is not None and trainer.model.training:
            result = recorded_loss(trainer.rule, trainer.loss_settings, recorder.last, on_policy)
            trainer.record_loss(result, recorder.last["_sampling_per_token_logps"])
        recorder.last = None
        return outputs

    return grpo_accumulated_loss


def install_rule(
    namespace: MutableMapping[str, Any], rule: ClipRule, settings: LossSettings, on_policy: bool = False
) -> Callable[[], None]:
    """Put the rule into a namespace holding Unsloth's three GRPO loss globals; returns a `restore()`.

    `on_policy`: every update of the run is the first on its rollout (π_old = π_θ, `make_grpo_compute_loss`).

    `namespace` is the generated trainer module's globals on a GPU (`trl.GRPOTrainer.compute_loss.__globals__`)
    or `unsloth_zoo.rl_replacements.__dict__` in the CPU tests.
    """
    missing = [name for name in LOSS_GLOBALS if name not in namespace]
    if missing:
        raise RuntimeError(f"Unsloth's GRPO loss globals not found ({', '.join(missing)}); is unsloth 2026.10.9 used?")
    saved = {name: namespace[name] for name in LOSS_GLOBALS}
    recorder = _Recorder(saved["UnslothEfficientGRPO"])
    namespace["grpo_compute_loss"] = make_grpo_compute_loss(rule, settings, on_policy)
    namespace["grpo_accumulated_loss"] = make_accumulated_loss(saved["grpo_accumulated_loss"], recorder, on_policy)
    namespace["UnslothEfficientGRPO"] = recorder

    def restore() -> None:
        namespace.update(saved)

    return restore
