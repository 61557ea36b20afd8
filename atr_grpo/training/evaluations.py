"""The evaluations of a training run (eval.every_steps, the end, and step 0), in one of two ways.

eval.when=after (the paper's default on a GPU). At each scheduled step the training process only saves the
adapter (eval/adapters/step_<N:06d>). After training, `evaluate_saved_adapters` runs in a process of its own (the
training process has exited, so its GPU memory, Unsloth's colocated engine included, is free) and evaluates
every waiting adapter with one vLLM engine sized for the longest prompt + eval.max_tokens: the paper's
32,768-token budget on the same single GPU. An adapter is deleted once its evaluation is recorded (unless
eval.keep_adapters); a failed step keeps it, and re-launching the run's command evaluates it again.

eval.when=during. The training process evaluates at each scheduled step on the live model: HF `generate`
(the TRL path) or Unsloth's colocated engine, whose context is model.max_seq_length. The adapter is saved
first and deleted after a successful evaluation, so a failed step can be evaluated later from its file.

Either way `check_evaluation_fits` runs before training: an evaluation that cannot fit (prompt + max_tokens
beyond the engine or the model's context, or an HF KV cache beyond memory) is refused with the keys named.
Generation runs under a forked RNG, so evaluating never changes the training run's random stream.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from atr_grpo import distributed
from atr_grpo.config import TrainConfig
from atr_grpo.console import StageProgress, console_is_terminal, evaluation_shown
from atr_grpo.evaluation import engines
from atr_grpo.evaluation.schedule import (
    EvaluationState,
    Schedule,
    adapter_dir,
    record_failure,
    remove_adapter,
    run_evaluation_state,
    saved_adapters,
)
from atr_grpo.machine import Decision, Machine, decide_evaluation
from atr_grpo.rundir import layout

if TYPE_CHECKING:  # transformers' Trainer stack, slow to import, which the checks before training
    # (`check_evaluation_fits`, in the parent of the stage processes) do not need
    from atr_grpo.evaluation.callback import EvaluationCallback

log = logging.getLogger(__name__)


def check_evaluation_fits(cfg: TrainConfig, backend: str | None) -> None:
    """Refuse, before training, an evaluation that could not run on `backend` (the run's evaluation backend,
    `machine.decide`; None: the run evaluates nothing) with the keys to change named."""
    from atr_grpo.models import load_tokenizer

    if backend is None:
        return
    tokenizer = load_tokenizer(cfg.model)
    longest = engines.longest_prompt(tokenizer, engines.load_benchmarks(cfg.eval, cfg.data), cfg.prompt)
    limit = cfg.model.max_seq_length if backend == "unsloth_vllm" else None
    engines.check_capacity(cfg.eval, cfg.model, longest, "vllm" if backend == "unsloth_vllm" else backend, limit)


def save_trainable(trainer: Any, directory: Path) -> None:
    """The trainer's trainable adapter into `directory`. Under a launcher every process calls it (a ZeRO-3 model
    is gathered from all of them by `Trainer.save_model`) and the main process writes."""
    if distributed.launched():
        trainer.save_model(str(directory))
    else:
        trainer.model.save_pretrained(str(directory))


def save_adapter(trainer: Any, run_dir: Path, step: int) -> Path:
    """The trainable adapter into eval/adapters/step_<N:06d>, written whole or not at all (called on every process)."""
    target = adapter_dir(run_dir, step)
    staging = layout.staging_dir(target)
    main = distributed.is_main()
    if main:
        shutil.rmtree(staging, ignore_errors=True)
    save_trainable(trainer, staging)
    if main:
        shutil.rmtree(target, ignore_errors=True)  # a re-save of the same step (a resumed run): ours to replace
        staging.rename(target)
    return target


def _metadata(cfg: TrainConfig, step: int, adapter: Any = None) -> dict[str, Any]:
    return {"model": cfg.model.name, "method": cfg.method, "seed": cfg.seed, "adapter_step": step}


def _run(cfg: TrainConfig, generator: Any, tokenizer: Any, benchmarks: list[Any], run_dir: Path, step: int) -> dict:
    from atr_grpo.evaluation import run_evaluation

    ev = cfg.eval
    with torch.random.fork_rng(devices=[]):
        return run_evaluation(
            generator,
            tokenizer,
            benchmarks,
            run_dir=run_dir,
            step=step,
            **engines.run_options(ev, cfg.prompt, step),
            metadata=_metadata(cfg, step),
            show_progress=console_is_terminal(),  # transient bars (generation, grading) on a terminal only
        )


def build_eval_callback(
    cfg: TrainConfig, trainer: Any, tokenizer: Any, run_dir: Path, logger: Any, decision: Decision
) -> EvaluationCallback:
    """The callback that saves each scheduled step's adapter and, with eval.when=during, evaluates it on
    `decision.evaluation_backend` (`logger`: the main process's RunLogger, None on the others)."""
    from atr_grpo.evaluation import HFGenerator, UnslothVLLMGenerator
    from atr_grpo.evaluation.callback import EvaluationCallback

    ev = cfg.eval
    benchmarks: list[Any] = []

    def evaluate_here(step: int) -> dict[str, float]:
        if not benchmarks:
            benchmarks.extend(engines.load_benchmarks(ev, cfg.data))
        if decision.evaluation_backend == "unsloth_vllm":
            generator: Any = UnslothVLLMGenerator(trainer.model, run_dir / "eval_lora")
        else:
            generator = HFGenerator(trainer.model, tokenizer, ev.batch_size, show_progress=console_is_terminal())
        return _run(cfg, generator, tokenizer, benchmarks, run_dir, step)

    def evaluate(step: int) -> dict[str, float]:
        if step == 0 and ev.share_start:  # the same samples in every run from this adapter: evaluated once
            from atr_grpo.training.shared_start import evaluate_start_once

            return evaluate_start_once(cfg, run_dir, ev.benchmarks, _metadata(cfg, 0), lambda: evaluate_here(0))
        return evaluate_here(step)

    def done(step: int) -> None:
        if not ev.keep_adapters:
            remove_adapter(run_dir, step)

    return EvaluationCallback(
        evaluate if ev.when == "during" else None,
        Schedule(ev.every_steps, ev.at_start),
        log_fn=None if logger is None else logger.log_eval,
        save_fn=lambda step: save_adapter(trainer, run_dir, step),
        failure_fn=lambda step, error: record_failure(run_dir, step, "during", error),
        done_fn=done,
        wait_fn=distributed.barrier,  # the other processes wait for the main one's evaluation
    )


def evaluate_saved_adapters(cfg: TrainConfig, run_dir: Path, machine: Machine | None = None) -> EvaluationState | None:
    """The evaluation stage: evaluate every waiting adapter of the run, one engine for all of them (the backend
    that `machine.decide_evaluation` gives on `machine`, this one by default).

    Each step's failure is recorded in eval/failures.jsonl and the next step goes on; returns the run's
    evaluation state afterwards (None when the run evaluates nothing).
    """
    from atr_grpo import rundir
    from atr_grpo.models import load_model_and_tokenizer, load_tokenizer
    from atr_grpo.training.run_logger import EvaluationMirror

    config = rundir.load_config(layout.config_path(run_dir))
    state = run_evaluation_state(run_dir, config)
    mirror = EvaluationMirror(cfg, run_dir, state.done if state else [])  # W&B first gets the done steps it lacks
    if state is None or not state.pending:
        mirror.close()
        return state
    ev, adapters = cfg.eval, saved_adapters(run_dir)
    backend = decide_evaluation(ev, machine).evaluation_backend
    tokenizer = load_tokenizer(cfg.model)
    benchmarks = engines.load_benchmarks(ev, cfg.data)
    engine = None
    log.info("evaluation stage: steps %s", state.pending)
    shown = evaluation_shown(ev.k)
    progress = StageProgress("evaluation", len(state.pending), shown=shown, latest=True, unit="adapter")
    for step in state.pending:
        try:
            if backend == "vllm":
                if engine is None:
                    longest = engines.longest_prompt(tokenizer, benchmarks, cfg.prompt)
                    engine = engines.vllm_generator(cfg.model, ev, longest, max_lora_rank=cfg.model.lora.r)
                generator: Any = engine.with_adapter(adapters[step])
            else:
                from atr_grpo.evaluation import HFGenerator

                model, _ = load_model_and_tokenizer(cfg.model, adapter_path=adapters[step])
                generator = HFGenerator(model, tokenizer, ev.batch_size, show_progress=progress.terminal)
            metrics = _run(cfg, generator, tokenizer, benchmarks, run_dir, step)
        except Exception as err:  # recorded, and the next step is still evaluated
            record_failure(run_dir, step, "after", err)
            log.error("evaluation stage: step %d failed", step, exc_info=err)
            progress.update()
            continue
        progress.update(metrics=metrics)
        mirror.log(step, metrics)
        if not ev.keep_adapters:
            remove_adapter(run_dir, step)
    progress.close()
    mirror.close()
    return run_evaluation_state(run_dir, config)
