"""The Unsloth path: the registered rule inside Unsloth's compiled, memory-efficient GRPO loss.

Importing `unsloth` on a GPU machine rewrites TRL's `GRPOTrainer` into a generated module whose
`compute_loss` calls `grpo_accumulated_loss` (chunked log-probs from hidden states, padding left-packed),
which calls `UnslothEfficientGRPO.apply`, which runs `grpo_compute_loss` under `torch.func.grad_and_value`
and `torch.compile(fullgraph=True)`. All three names are globals of that generated module, so the rule
goes in by replacing them there (`install_rule`):

- `grpo_compute_loss`  → `make_grpo_compute_loss(rule, ...)`: the same Dr.GRPO loss as the TRL path
  (`rule.terms` → `aggregate` → / gradient-accumulation steps), written as pure tensor code;
- `grpo_accumulated_loss` → a wrapper that adds the rule's extras in a layout-independent form
  (Clip-Cov's key seed, the full-vocabulary KL of the valid tokens in order) and, afterwards, logs the
  rule's `clip/*`, `ratio/*`, `kl/*` metrics from the exact tensors the compiled loss saw;
- `UnslothEfficientGRPO` → a thin shim that records those tensors, then calls the real one.

Nothing here imports unsloth at module level: the loss functions are plain torch and are tested on CPU
inside unsloth_zoo's real `UnslothEfficientGRPO` (tests/test_unsloth_path.py).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from atr_grpo import rundir
from atr_grpo.clipping import ClipRule
from atr_grpo.clipping.base import LOG_RATIO_LIMIT, make_batch
from atr_grpo.clipping.cov import key_seed_from
from atr_grpo.config import ConfigError, TrainConfig
from atr_grpo.losses import aggregate, kl_penalty

log = logging.getLogger(__name__)

# kwargs we add to Unsloth's loss kwargs (they reach `grpo_compute_loss` untouched)
KEY_SEED = "atr_key_seed"
FULL_KL = "atr_full_kl"

# Unsloth switches that replace the loss normaliser or π_old: the two paths would no longer train alike
UNSUPPORTED_ENV = (
    "UNSLOTH_GRPO_ZERO_VARIANCE_EXCLUDE",
    "UNSLOTH_GRPO_LOSS_AGGREGATION",
    "UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD",
)


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


# ------------------------------------------------------------------------------- the compiled loss
def make_grpo_compute_loss(
    rule: ClipRule,
    loss_agg: str = "dr_grpo",
    kl_estimator: str = "k3",
    kl_importance_weight: bool = True,
) -> Callable[..., tuple]:
    """A drop-in for unsloth_zoo's `grpo_compute_loss` whose per-token loss is `rule`.

    Returns `(loss, completion_length, mean_kl, delta, flat_is_ratio, coef_1, mask)` like zoo's. The loss
    is already normalised (Dr.GRPO constant, / gradient-accumulation steps): Unsloth's backward returns
    the gradient computed here and ignores the upstream one. Pure tensor ops only (no `.item()`, no
    branching on values): it runs under `torch.func.grad_and_value` and a fullgraph compile.
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
        old_logp = new.detach() if old is None else old  # TRL skips π_old when on-policy: w ≡ 1
        batch = make_batch(new, old_logp, advantages, mask)
        extras: dict[str, Tensor] = {}
        if kwargs.get(KEY_SEED) is not None:
            extras["key_seed"] = kwargs[KEY_SEED]
        if kwargs.get(FULL_KL) is not None:
            extras["full_kl"] = expand_compact(kwargs[FULL_KL], valid)
        per_token = torch.where(batch.mask, rule.terms(batch, **extras).loss, 0.0)

        mean_kl = maskf.new_zeros(())
        if beta != 0.0:
            weight = torch.exp(new - old_logp) if kl_importance_weight else None
            penalty = kl_penalty(new, ref, mask, kl_estimator, weight)
            per_token = per_token + beta * penalty
            mean_kl = (penalty * maskf).sum() / maskf.sum().clamp(min=1.0)

        loss = aggregate(per_token, mask, loss_agg, kwargs["max_completion_length"])
        loss = loss / kwargs.get("current_gradient_accumulation_steps", 1)
        coef_1 = torch.exp(batch.log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).detach()
        completion_length = maskf.sum(1).mean()
        empty = maskf.new_zeros(0)  # vLLM importance-sampling outputs: that correction is off on this path
        return loss, completion_length, mean_kl, empty, empty, coef_1, maskf

    grpo_compute_loss.atr_rule = rule  # type: ignore[attr-defined]
    return grpo_compute_loss


# ------------------------------------------------------------------------- extras and metrics (eager)
class _Recorder:
    """Stands in for `UnslothEfficientGRPO`: records what the compiled loss is given, then calls it."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.last: dict[str, Any] | None = None

    def apply(self, new: Tensor, old: Tensor | None, ref: Tensor | None, sampling: Any, *rest: Any) -> Any:
        mask, advantages, kwargs = rest[2], rest[3], rest[7]
        self.last = {
            "new": new.detach(),
            "old": None if old is None else old.detach(),
            "mask": mask,
            "advantages": advantages,
            "kwargs": kwargs,
        }
        return self.real.apply(new, old, ref, sampling, *rest)


def rule_metrics_from_record(rule: ClipRule, record: dict[str, Any]) -> dict[str, float]:
    """The rule's metrics over exactly the tensors (packed layout) the compiled loss saw."""
    new, mask, kwargs = record["new"], record["mask"], record["kwargs"]
    old = new if record["old"] is None else record["old"]
    extras: dict[str, Any] = {}
    if kwargs.get(KEY_SEED) is not None:
        extras["key_seed"] = kwargs[KEY_SEED]
    if kwargs.get(FULL_KL) is not None:
        extras["full_kl"] = expand_compact(kwargs[FULL_KL], mask.bool())
    with torch.no_grad():
        return rule(new, old, record["advantages"], mask, **extras).metrics


def make_accumulated_loss(original: Callable[..., tuple], recorder: _Recorder) -> Callable[..., tuple]:
    """Wrap zoo's `grpo_accumulated_loss`: add the rule's extras, then log the rule's metrics."""

    @functools.wraps(original)  # Unsloth inspects this function's signature and source
    def grpo_accumulated_loss(trainer: Any, *args: Any, **kwargs: Any) -> tuple:
        if not hasattr(trainer, "rule_extras"):  # a trainer that is not ours: leave Unsloth alone
            return original(trainer, *args, **kwargs)
        bound = _bind(original, trainer, args, kwargs)
        completion_mask = bound["completion_mask"]
        if bound.get("tool_mask") is not None:
            completion_mask = completion_mask * bound["tool_mask"]
        extras = trainer.rule_extras(
            trainer.model,
            bound["input_ids"],
            bound["attention_mask"],
            bound["logits_to_keep"],
            completion_mask.float(),
            bound.get("old_logps") is not None,
        )
        if extras.get("generator") is not None:
            kwargs[KEY_SEED] = key_seed_from(extras["generator"])
        if extras.get("full_kl") is not None:
            kwargs[FULL_KL] = compact_valid(extras["full_kl"].float(), completion_mask)
        recorder.last = None
        outputs = original(trainer, *args, **kwargs)
        if recorder.last is not None:
            mode = "train" if trainer.model.training else "eval"
            for key, value in rule_metrics_from_record(trainer.rule, recorder.last).items():
                trainer._metrics[mode][key].append(value)
            recorder.last = None
        return outputs

    return grpo_accumulated_loss


def _bind(function: Callable[..., Any], trainer: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    import inspect

    bound = inspect.signature(function).bind_partial(trainer, *args, **kwargs)
    values = dict(bound.arguments)
    values.update(values.pop("kwargs", {}))
    return values


@contextmanager
def install_rule(
    namespace: MutableMapping[str, Any],
    rule: ClipRule,
    loss_agg: str = "dr_grpo",
    kl_estimator: str = "k3",
    kl_importance_weight: bool = True,
) -> Iterator[_Recorder]:
    """Put the rule into a namespace holding Unsloth's three GRPO loss globals; restored on exit.

    `namespace` is the generated trainer module's globals on a GPU (`trl.GRPOTrainer.compute_loss.__globals__`)
    or `unsloth_zoo.rl_replacements.__dict__` in the CPU tests.
    """
    needed = ("grpo_compute_loss", "grpo_accumulated_loss", "UnslothEfficientGRPO")
    missing = [name for name in needed if name not in namespace]
    if missing:
        raise RuntimeError(f"Unsloth's GRPO loss globals not found ({', '.join(missing)}); is unsloth 2026.10.7 used?")
    saved = {name: namespace[name] for name in needed}
    recorder = _Recorder(saved["UnslothEfficientGRPO"])
    namespace["grpo_compute_loss"] = make_grpo_compute_loss(rule, loss_agg, kl_estimator, kl_importance_weight)
    namespace["grpo_accumulated_loss"] = make_accumulated_loss(saved["grpo_accumulated_loss"], recorder)
    namespace["UnslothEfficientGRPO"] = recorder
    try:
        yield recorder
    finally:
        namespace.update(saved)


# --------------------------------------------------------------------------- Unsloth's silent overrides
def neutralise_overrides(args: Any, wanted: dict[str, Any]) -> list[str]:
    """Set back every value Unsloth's config class changed; returns "key: theirs -> ours" for each."""
    changed = []
    for key, value in wanted.items():
        current = getattr(args, key, None)
        if current != value:
            changed.append(f"{key}: {current!r} -> {value!r}")
            setattr(args, key, value)
    return changed


# Attributes GRPOTrainer copies from its args in __init__ (same names); checked after construction
TRAINER_ATTRIBUTES = (
    "beta",
    "loss_type",
    "scale_rewards",
    "mask_truncated_completions",
    "max_completion_length",
    "num_generations",
    "temperature",
)


def check_trainer_settings(trainer: Any, wanted: dict[str, Any]) -> None:
    """After `__init__`, the trainer must still train with our settings (it copies some of them)."""
    for attribute in TRAINER_ATTRIBUTES:
        found = getattr(trainer, attribute, wanted.get(attribute))
        if attribute in wanted and found != wanted[attribute]:
            raise RuntimeError(
                f"the Unsloth trainer changed {attribute} from {wanted[attribute]!r} to {found!r}; "
                "the two training paths would differ (use trainer.backend=trl)"
            )
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation"):
        if key in wanted and getattr(trainer.args, key) != wanted[key]:
            found = getattr(trainer.args, key)
            raise RuntimeError(f"the Unsloth trainer changed {key} from {wanted[key]!r} to {found!r}")


# ------------------------------------------------------------------------------------- the trainer (GPU)
def load_unsloth_model(cfg: TrainConfig, adapter: Path | None) -> tuple[Any, Any]:
    """Unsloth's model (+ colocated vLLM when model.fast_inference) with the paper's LoRA, SFT weights loaded."""
    from unsloth import FastLanguageModel  # noqa: I001  (must precede trl/transformers use)

    from atr_grpo.models import resolve_model_path

    model_cfg, lora = cfg.model, cfg.model.lora
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=resolve_model_path(model_cfg),
        max_seq_length=model_cfg.max_seq_length,
        dtype=None if model_cfg.dtype == "auto" else getattr(torch, model_cfg.dtype),
        load_in_4bit=model_cfg.load_in_4bit,
        fast_inference=model_cfg.fast_inference,
        max_lora_rank=lora.r,
        gpu_memory_utilization=model_cfg.gpu_memory_utilization,
        random_state=cfg.seed,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=lora.r,
        target_modules=list(lora.target_modules),
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        use_gradient_checkpointing="unsloth" if cfg.trainer.gradient_checkpointing != "false" else False,
        random_state=cfg.seed,
    )
    if adapter is not None:
        load_adapter_weights(model, adapter)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_adapter_weights(model: Any, adapter: Path) -> None:
    """Copy a saved LoRA adapter (the SFT stage's) into the model's fresh adapter of the same shape."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise RuntimeError(f"adapter {adapter} does not match the model's LoRA: unexpected keys {unexpected[:3]}")


def check_environment() -> None:
    set_vars = [name for name in UNSUPPORTED_ENV if os.environ.get(name)]
    if set_vars:
        raise ConfigError(
            f"unset {', '.join(set_vars)}: they change Unsloth's loss normaliser or π_old, so the Unsloth path "
            "would no longer train like the TRL path"
        )


def build_unsloth_trainer(cfg: TrainConfig, rule: ClipRule, adapter: Path | None, run_dir: Path) -> tuple[Any, Any]:
    """Unsloth's generated GRPOTrainer with the rule installed, the same settings as the TRL path."""
    check_environment()
    if cfg.trainer.vllm_importance_sampling_correction:
        raise ConfigError(
            "invalid config: trainer.vllm_importance_sampling_correction must be false with trainer.backend=unsloth "
            "(the rule's loss replaces Unsloth's, which is where that correction lives)"
        )
    model, tokenizer = load_unsloth_model(cfg, adapter)  # imports unsloth first: it patches trl

    import trl

    from atr_grpo.data.datasets import grpo_dataset
    from atr_grpo.rewards import math_verify_reward
    from atr_grpo.training.grpo import RuleTrainerMixin, grpo_arg_values
    from atr_grpo.training.pipeline import filter_long_prompts

    namespace = trl.GRPOTrainer.compute_loss.__globals__
    if "grpo_accumulated_loss" not in namespace:
        raise RuntimeError("trl.GRPOTrainer is not Unsloth's generated trainer: import unsloth before trl")

    wanted = grpo_arg_values(cfg, run_dir / rundir.CHECKPOINT_DIR, use_vllm=cfg.model.fast_inference)
    wanted.update(
        unsloth_num_chunks=-1,
        # any quantile < 1 makes zoo compute per-token entropies; `get_high_entropy_mask` below logs them and
        # keeps every token, so the loss is unchanged
        top_entropy_quantile=1.0 - 1e-6,
    )
    args = trl.GRPOConfig(**wanted)
    for change in neutralise_overrides(args, wanted):
        log.info("neutralised an Unsloth config override: %s", change)

    class UnslothRuleTrainer(RuleTrainerMixin, trl.GRPOTrainer):
        def __init__(self, *init_args: Any, rule: ClipRule, **init_kwargs: Any) -> None:
            self._setup_rule(rule, cfg.trainer.loss_agg, cfg.trainer.kl_estimator, cfg.trainer.kl_importance_weight)
            super().__init__(*init_args, **init_kwargs)

        def get_high_entropy_mask(self, entropies: Tensor, mask: Tensor, threshold: float) -> Tensor:
            valid = mask.bool()
            mode = "train" if self.model.training else "eval"
            value = entropies[valid].float().mean().item() if valid.any() else float("nan")
            self._metrics[mode]["entropy"].append(value)
            return valid

    dataset = filter_long_prompts(grpo_dataset(cfg.data, cfg.prompt), tokenizer, cfg)
    trainer = UnslothRuleTrainer(
        model=model,
        reward_funcs=[math_verify_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rule=rule,
    )
    check_trainer_settings(trainer, wanted)
    trainer._atr_rule_installation = install_rule(
        namespace, rule, cfg.trainer.loss_agg, cfg.trainer.kl_estimator, cfg.trainer.kl_importance_weight
    )
    trainer._atr_rule_installation.__enter__()  # for the life of the process: one run per process
    return trainer, tokenizer
