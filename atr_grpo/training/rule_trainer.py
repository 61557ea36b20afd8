"""What both trainer paths (TRL's `GRPOTrainer`, Unsloth's generated one) share around the rule.

- `grpo_arg_values`: TRL's config values from ours; everything that changes the loss or the sampler is set
  explicitly, never left to a library default.
- `RuleTrainerMixin`: the rule and its `LossSettings`, the rule's extras for a micro-batch (as `training.extras`
  provides them from a `TrainerBatch`; the δ in force), and one `record_loss` that turns a
  micro-batch's `GRPOLoss` into the step's metrics: the rule's `clip/*` (with `clip/delta` for a δ-rule),
  `ratio/*`, `kl/*`, the entropy, and under `rollout/` the rollout-engine mismatch and the correction's weights.
  Metrics are pooled over micro-batches and processes (`step_stats.StepStats`) and added to TRL's log at each
  logging step. A δ-rule's `DeltaControl` moves δ after each optimizer step and is saved with each checkpoint, as
  is the record of the training prompts generated from (`PromptsSeen`), whose count and hash end in the train summary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor
from transformers import TrainerCallback, TrainerState

from atr_grpo import rundir
from atr_grpo.clipping import ClipRule
from atr_grpo.clipping.adaptive_delta import takes_delta
from atr_grpo.config import TrainConfig
from atr_grpo.distributed import process_batch, world_size
from atr_grpo.losses import GRPOLoss, LossSettings, resolve_aggregation
from atr_grpo.rule_random import micro_batch_stream
from atr_grpo.rundir import layout
from atr_grpo.training import checkpoints
from atr_grpo.training.delta_control import DeltaControl
from atr_grpo.training.extras import TrainerBatch, keeps_old_weights, trainer_extras
from atr_grpo.training.prompts_seen import PromptsSeen
from atr_grpo.training.run_logger import SUMMARY_KEYS
from atr_grpo.training.step_stats import StepStats, ratio_outside_box, rollout_mismatch
from atr_grpo.training.truncated import TruncationMixin
from atr_grpo.training.vocab_kl import adapter_snapshot
from atr_grpo.truncation import Truncation

log = logging.getLogger(__name__)


def resolve_flag(value: bool | str | None, default: bool) -> bool:
    """A setting that may be left to the machine: None or "auto" → `default`."""
    if value is None or value == "auto":
        return default
    return value is True or value == "true"


def loss_settings(cfg: TrainConfig) -> LossSettings:
    """The loss settings of a run; `trainer.loss_agg=native` becomes the rule's own aggregation, and a sequence
    rule under a token-sum aggregation is pointed out, once, in the log (the console shows it)."""
    from atr_grpo.clipping import RULES

    tr = cfg.trainer
    loss_agg, notice = resolve_aggregation(tr.loss_agg, RULES[cfg.clipping.name])
    if notice is not None:
        log.warning("NOTE: %s", notice)
    return LossSettings(
        loss_agg=loss_agg,
        max_completion_length=tr.max_completion_length,
        beta=tr.beta,
        kl_estimator=tr.kl_estimator,
        kl_importance_weight=tr.kl_importance_weight,
        correction=cfg.rollout.rollout_correction(),
    )


def delta_control(cfg: TrainConfig) -> DeltaControl | None:
    """The δ in force over a run of a δ-rule (constant, scheduled or controlled), starting from the δ of the rule the
    run trains with (`ClippingConfig.rule`): the one δ that reaches the loss. None for other rules."""
    if not takes_delta(cfg.clipping.name):
        return None
    return DeltaControl(
        initial=cfg.clipping.rule().delta,
        total_steps=cfg.trainer.max_steps,
        steps_per_rollout=cfg.optimizer_steps_per_rollout,
        settings=cfg.clipping.delta_control_settings(),
    )


def vllm_arg_values(cfg: TrainConfig, rollout_engine: str | None) -> dict[str, Any]:
    """TRL's vLLM settings from `rollout.*` (`rollout_engine`, the run's, is vllm): colocated engine or a
    `trl vllm-serve` server."""
    ro, tr = cfg.rollout, cfg.trainer
    if rollout_engine != "vllm":
        return {"use_vllm": False}
    vllm = ro.vllm
    values: dict[str, Any] = {
        "use_vllm": True,
        "vllm_mode": vllm.mode,
        # the rollout engine needs room for the longest prompt plus a full completion, and nothing more
        "vllm_max_model_length": tr.max_prompt_length + tr.max_completion_length,
        "vllm_gpu_memory_utilization": vllm.gpu_memory_utilization,
        "vllm_enable_sleep_mode": vllm.enable_sleep_mode,
    }
    if vllm.mode == "server":
        values.update(
            vllm_server_base_url=vllm.server_base_url,
            vllm_server_host=vllm.server_host,
            vllm_server_port=vllm.server_port,
            vllm_server_timeout=vllm.server_timeout,
            vllm_group_port=vllm.group_port,
        )
    return values


def grpo_arg_values(cfg: TrainConfig, output_dir: str | Path, rollout_engine: str | None) -> dict[str, Any]:
    """TRL's `GRPOConfig` values from ours, sampling with `rollout_engine` (the run's: `machine.decide`); both
    paths use these, and Unsloth's config class changes some silently, which `unsloth_trainer` undoes and checks."""
    tr, cuda = cfg.trainer, torch.cuda.is_available()
    # the config's micro-batch counts are global: each of N launched processes does 1/N of them
    share = process_batch(
        tr.per_device_train_batch_size, tr.gradient_accumulation_steps, cfg.steps_per_generation, world_size()
    )
    return dict(
        output_dir=str(output_dir),
        seed=cfg.seed,
        # batching and staleness (rollout.*): how many optimizer steps share one generation batch
        per_device_train_batch_size=tr.per_device_train_batch_size,
        gradient_accumulation_steps=share.gradient_accumulation_steps,
        num_generations=tr.num_generations,
        steps_per_generation=share.steps_per_generation,
        num_iterations=cfg.rollout.num_iterations,
        # sampling
        temperature=tr.temperature,
        top_p=tr.top_p,
        top_k=0 if tr.top_k == -1 else tr.top_k,  # TRL/transformers: 0 = off
        max_completion_length=tr.max_completion_length,
        chat_template_kwargs={"enable_thinking": cfg.prompt.enable_thinking},
        # loss: our loss does the work; these keep TRL's own bookkeeping consistent with it
        loss_type="dr_grpo",
        scale_rewards=tr.scale_rewards,
        beta=tr.beta,
        # trainer.truncation=mask masks in `RuleTrainerMixin.apply_truncation`, with the toolkit's one definition
        mask_truncated_completions=False,
        disable_dropout=True,  # stale ratios must come from the update, not from dropout masks
        # TRL's own correction stays off: ours (rollout.correction) weighs the loss on both paths
        vllm_importance_sampling_correction=False,
        **vllm_arg_values(cfg, rollout_engine),
        # optimisation
        learning_rate=tr.learning_rate,
        weight_decay=tr.weight_decay,
        optim=tr.optim,
        adam_beta1=tr.adam_beta1,
        adam_beta2=tr.adam_beta2,
        lr_scheduler_type=tr.lr_scheduler_type,
        warmup_steps=tr.warmup_ratio,  # transformers 5: a float in [0, 1) is a fraction of max_steps
        max_grad_norm=tr.max_grad_norm,
        max_steps=tr.max_steps,
        bf16=resolve_flag(tr.bf16, cuda),
        gradient_checkpointing=resolve_flag(tr.gradient_checkpointing, cuda),
        use_cpu=not cuda,
        # processes (under a launcher): every LoRA weight takes part in every forward, so DDP need not search
        ddp_find_unused_parameters=False,
        ddp_timeout=tr.ddp_timeout,
        # bookkeeping
        logging_steps=tr.logging_steps,
        save_strategy="steps",
        save_steps=tr.save_steps,
        save_total_limit=tr.save_total_limit,
        report_to="none",  # W&B is fed by our own callback, with the same keys as metrics.jsonl
        log_completions=tr.log_completions,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )


class GRPOTrainerHost(Protocol):
    """What `RuleTrainerMixin` uses of the `GRPOTrainer` it is mixed into (TRL's, or Unsloth's generated one).

    The methods the mixin extends (and calls through `super()`) are declared as callables.
    """

    model: torch.nn.Module
    args: Any  # GRPOConfig: seed, output_dir, should_save, save_total_limit
    state: TrainerState
    accelerator: Any  # accelerate.Accelerator: process_index, device, unwrap_model, wait_for_everyone
    callback_handler: Any  # transformers' CallbackHandler: callbacks
    temperature: float
    current_gradient_accumulation_steps: int
    _step: int  # TRL's count of micro-batches in this process

    def add_callback(self, callback: TrainerCallback) -> None: ...

    _generate_and_score_completions: Callable[[Any], Any]
    train: Callable[..., Any]
    _get_output_dir: Callable[[Any], str]
    _save_checkpoint: Callable[[Any, Any], None]
    log: Callable[[dict[str, float], float | None], None]


if TYPE_CHECKING:
    _Host = GRPOTrainerHost
else:
    _Host = object


class RuleTrainerMixin(TruncationMixin, _Host):
    """Added in front of a `GRPOTrainer` class (TRL's or Unsloth's): the rule, its extras and its metrics."""

    _checkpoint_staging: Path | None = None  # set while `_save_checkpoint` runs

    def _setup_rule(
        self,
        rule: ClipRule,
        settings: LossSettings,
        delta: DeltaControl | None = None,
        truncation: Truncation | None = None,
    ) -> None:
        """`truncation` may be None only where nothing is generated (the loss alone)."""
        self.rule = rule
        self.truncation = truncation
        self.loss_settings = settings
        self.delta_control = delta
        self._old_adapter: dict[str, Tensor] | None = None
        self._step_stats = StepStats()
        self.prompts_seen = PromptsSeen()

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        keep_old = keeps_old_weights(self.rule.needs)  # first: names an extra no provider can give
        if self.model.training:
            self._record_prompts(inputs)
        # π_old's weights, for an extra computed from them (the full-vocabulary KL): those that generate this rollout
        if keep_old:
            self._old_adapter = adapter_snapshot(self.accelerator.unwrap_model(self.model))
        return self.apply_truncation(super()._generate_and_score_completions(inputs))

    def _record_prompts(self, inputs: Any) -> None:
        """The generation batch's prompt ids (every process's), under the optimizer step that first trains on it."""
        from atr_grpo.data.datasets import PROMPT_ID

        ids = [row[PROMPT_ID] for row in inputs if PROMPT_ID in row]
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            ids = gather_object(ids)
        self.prompts_seen.add(self.state.global_step + 1, ids)

    def rule_extras(
        self,
        model: Any,
        input_ids: Tensor,
        attention_mask: Tensor,
        logits_to_keep: int,
        like: Tensor,
        has_old: bool,
        entropy: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """The δ in force (δ-rules) and the rule's declared extras (`training.extras`), in the layout of `like`
        (`[B, logits_to_keep]`); `entropy`: π_θ's per-token entropy when the caller's forward pass computed it."""
        extras: dict[str, Tensor] = {}
        if self.delta_control is not None:  # a tensor: a new value does not recompile Unsloth's compiled loss
            extras["delta"] = torch.tensor(self.delta_control.delta, dtype=torch.float32, device=like.device)
        if self.rule.needs:
            process = self.accelerator.process_index
            batch = TrainerBatch(
                like=like,
                on_policy=not has_old,
                random=lambda: micro_batch_stream(self.args.seed, self.state.global_step, self._micro_step(), process),
                model=self.accelerator.unwrap_model(model),
                old_weights=self._old_adapter,
                input_ids=input_ids,
                attention_mask=attention_mask,
                logits_to_keep=logits_to_keep,
                temperature=self.temperature,
                entropy=entropy,
            )
            extras.update(trainer_extras(self.rule.needs, batch))
        return extras

    def _micro_step(self) -> int:
        """The micro-batch's index since the start of training, computed from the optimizer step (restored on
        resume), not from TRL's `_step`, which counts from 0 again in a resumed process: an uninterrupted run gets
        TRL's count, and a resumed one the same keys as that run."""
        accumulation = self.current_gradient_accumulation_steps
        return self.state.global_step * accumulation + self._step % accumulation

    def record_loss(self, result: GRPOLoss, sampling_logp: Tensor | None = None) -> None:
        """A training micro-batch's metrics: the rule's, the δ in force, the KL to the reference, the rollout
        mismatch and the correction's weights."""
        valid = result.batch.mask
        count = int(valid.sum())
        metrics = result.metrics()
        if self.delta_control is not None:
            metrics["clip/delta"] = self.delta_control.delta
            self.delta_control.observe(metrics["kl/kl3_mean"], count)
        if result.kl_ref is not None:
            metrics["kl_ref"] = float(torch.where(valid, result.kl_ref, 0.0).sum() / max(count, 1))
        self._step_stats.add(metrics, count)
        if sampling_logp is not None:  # π_old's log-probs from the trainer vs the rollout engine's, over the
            # completion's tokens (a rollout rejection's included: the rule's metrics above are over the kept ones)
            completion, old_logp = valid, result.batch.old_logp
            if result.completion_mask is not None and result.completion_old_logp is not None:
                completion, old_logp = result.completion_mask, result.completion_old_logp
            rollout = rollout_mismatch(sampling_logp, old_logp, completion)
            rollout.update(ratio_outside_box(self.rule, sampling_logp, old_logp, completion))
            rollout.update(self.loss_settings.correction.metrics(old_logp, sampling_logp, completion))
            self._step_stats.add(rollout, int(completion.sum()))

    def check_sampling_logp(self, sampling_logp: Tensor | None) -> None:
        """A rollout correction (ours, or the rule's own) without the engine's log-probs is an error, never a silent
        no-op."""
        if sampling_logp is not None or not self.model.training:
            return
        correction = self.loss_settings.correction
        if correction.weighs:
            setting = f"rollout.correction={correction.kind}"
        elif correction.rejects:
            setting = f"rollout.rejection={correction.rejection}"
        elif self.rule.owns_correction:
            setting = f"clipping.name={self.rule.name} (a rule that owns the rollout correction)"
        else:
            return
        raise RuntimeError(
            f"{setting}, but this batch carries no log-probs from the rollout engine (rollout.engine must be "
            "vllm, and the engine must return the sampled tokens' log-probs)"
        )

    # ------------------------------------------------------------------------------ adaptive δ
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """Before training: the prompts seen and δ restored from the checkpoint resumed from, and the step hook that
        moves δ."""
        if resume_from_checkpoint:
            self._load_prompts_seen(resume_from_checkpoint)
        if self.delta_control is not None:
            if resume_from_checkpoint:
                self._load_delta(self.delta_control, resume_from_checkpoint)
            callbacks = self.callback_handler.callbacks
            if not any(isinstance(callback, DeltaStep) for callback in callbacks):
                self.add_callback(DeltaStep(self))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def end_delta_step(self) -> None:
        if self.delta_control is not None:  # the step hook exists only then
            self.delta_control.end_step(self.state.global_step, self._all_reduce)

    # ------------------------------------------------------------------------------ checkpoints
    def _get_output_dir(self, trial: Any) -> str:
        """Where transformers writes a checkpoint: its temporary folder while `_save_checkpoint` runs."""
        staging = self._checkpoint_staging
        return str(staging) if staging is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """transformers' save (and the δ in force) under a temporary name, renamed into place once every process
        has written its part (`training.checkpoints`): a kill during the save leaves the previous checkpoint the
        newest."""
        from transformers.trainer_utils import rotate_checkpoints

        root = Path(super()._get_output_dir(trial))
        checkpoint = root / f"{checkpoints.PREFIX}-{self.state.global_step}"
        wait = self.accelerator.wait_for_everyone
        if self.args.should_save:
            checkpoints.discard_partial(checkpoint)  # what a save killed at this step before left behind
        wait()
        self._checkpoint_staging = checkpoints.staging_dir(checkpoint)
        try:
            super()._save_checkpoint(model, trial)
            if self.args.should_save:
                folder = self._checkpoint_staging / checkpoint.name
                rundir.write_json(folder / layout.PROMPTS_SEEN_FILE, self.prompts_seen.state_dict())
                if self.delta_control is not None:
                    rundir.write_json(folder / layout.DELTA_STATE_FILE, self.delta_control.state_dict())
        finally:
            self._checkpoint_staging = None
        wait()  # every process's files (its RNG state) are in place
        if self.args.should_save:
            checkpoints.commit(checkpoint)
            rotate_checkpoints(str(root), self.args.save_total_limit, use_mtime=True)
        wait()

    def _checkpoint_path(self, checkpoint: str | bool) -> Path:
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.args.output_dir)
        return Path(str(checkpoint))

    def _load_prompts_seen(self, checkpoint: str | bool) -> None:
        """The prompts seen up to the checkpoint's step; a checkpoint from before they were recorded has none, and
        the run's count then starts at its resume (a warning says so)."""
        folder = self._checkpoint_path(checkpoint)
        path = folder / layout.PROMPTS_SEEN_FILE
        if not path.exists():
            log.warning("%s is missing: the prompts seen are counted from this resume on", path)
            return
        try:
            self.prompts_seen.load_state_dict(rundir.read_json(path), checkpoints.checkpoint_step(folder))
        except (AttributeError, KeyError, TypeError, ValueError) as err:  # valid JSON, but not this record
            raise rundir.RunFileError(f"{path}: the prompts seen cannot be restored ({err!r})") from None

    def _load_delta(self, control: DeltaControl, checkpoint: str | bool) -> None:
        path = self._checkpoint_path(checkpoint) / layout.DELTA_STATE_FILE
        if path.exists():
            try:
                control.load_state_dict(rundir.read_json(path))
            except rundir.RunFileError:
                raise
            except (AttributeError, KeyError, TypeError, ValueError) as err:  # valid JSON, but not this run's δ state
                raise rundir.RunFileError(f"{path}: the δ in force cannot be restored ({err!r})") from None
        elif control.adapts:
            raise FileNotFoundError(f"{path} is missing: the δ of this adaptive-δ run cannot be restored")

    def record_entropy(self, entropies: Tensor, mask: Tensor) -> None:
        valid = mask.bool()
        count = int(valid.sum())
        value = float(torch.where(valid, entropies.detach().float(), 0.0).sum() / max(count, 1))
        self._step_stats.add({"entropy": value}, count)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the step's pooled metrics (global over micro-batches and processes) to TRL's log."""
        if self._step_stats.keys():
            logs.update(self._step_stats.reduce(self._all_reduce))
        if any(key in logs for key in SUMMARY_KEYS):  # the end-of-training summary (train_summary.json)
            logs.update(self.prompts_seen.summary())
        super().log(logs, start_time)

    def _all_reduce(self, tensor: Tensor, op: str) -> Tensor:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return tensor
        pooled = tensor.to(self.accelerator.device)
        dist.all_reduce(pooled, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
        return pooled.cpu()


class DeltaStep(TrainerCallback):
    """After each optimizer step (before its metrics are logged and its checkpoint saved): the next step's δ."""

    def __init__(self, trainer: RuleTrainerMixin) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        self.trainer.end_delta_step()
