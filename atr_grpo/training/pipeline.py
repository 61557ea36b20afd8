"""One training run, top to bottom: checks → run directory → SFT format stage → GRPO with the rule → evaluation.

preflight          what the machine and the config must allow, checked before any model is loaded
prepare_run_dir    refuse to overwrite; a re-launch of the same config continues the run (the main
                   process holds the run directory's lock first: one process per run directory)
ensure_sft_adapter the cached format-stage adapter all methods of a model start from (its own process)
train_grpo         TRL path (CPU, or GPU without Unsloth) or Unsloth path; checkpoints every save_steps,
                   metrics.jsonl every step, an adapter (and, eval.when=during, an evaluation) at each
                   scheduled evaluation step
evaluation stage   eval.when=after: the saved adapters, in a process of its own once training has exited

`run_pipeline` is `python -m atr_grpo.train`: with eval.when=after the GRPO stage and the evaluation stage
each run in a fresh process (`atr_grpo.training.stages`), so the evaluator gets the GPU memory training used.
`run_training` is the GRPO stage in the calling process (tests, notebooks, extra callbacks).

Under a launcher (`torchrun`, `accelerate launch`: `atr_grpo.distributed`) every process checks the config,
the main one prepares the run directory and the others receive its state, and the processes themselves are
the GRPO stage: only the main process writes run files, and the evaluation stage (eval.when=after) is started
once, by the main process, after the process group is gone.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import OmegaConf

from atr_grpo import distributed, run_environment, rundir
from atr_grpo.clipping import RULES
from atr_grpo.config import TrainConfig
from atr_grpo.config_training import truncated_sampling
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation.schedule import EvaluationState, record_failure, run_evaluation_state, saved_adapters
from atr_grpo.machine import Decision, decide
from atr_grpo.provenance import loaded_models
from atr_grpo.rundir import layout, records
from atr_grpo.training import checkpoints, interrupts

log = logging.getLogger(__name__)

T = TypeVar("T")

# exit status of a run whose training finished but whose scheduled evaluations are not all done
EXIT_EVALUATIONS_INCOMPLETE = 3


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (it would overwrite or mix runs)."""


@dataclass
class RunState:
    run_dir: Path
    resume_from: Path | None  # the newest checkpoint when resuming
    finished: bool  # the run already reached its last step


# ------------------------------------------------------------------------------------------ run dir
def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (a cut-off newer one is named in a warning and skipped)."""
    return checkpoints.latest_complete_checkpoint(run_dir / rundir.CHECKPOINT_DIR)


def run_state(run_dir: Path) -> RunState:
    """The state of an existing run directory (for a stage process: nothing is written)."""
    finished = records.is_done(run_dir)
    return RunState(run_dir, None if finished else latest_checkpoint(run_dir), finished)


def prepare_run_dir(cfg: TrainConfig, config_yaml: str, decision: Decision) -> RunState:
    """Create a fresh run directory, or continue the run already in it. Never overwrites a run. env.json records
    what the run runs on (`decision`)."""
    run_dir = Path(cfg.run_dir)
    config_path = run_dir / rundir.CONFIG_FILE
    if not config_path.exists():
        if cfg.resume:
            raise RunDirError(f"resume=true but {run_dir} holds no run to continue (no {rundir.CONFIG_FILE})")
        if (run_dir / rundir.CHECKPOINT_DIR).exists() or (run_dir / rundir.METRICS_FILE).exists():
            raise RunDirError(
                f"{run_dir} holds checkpoints or metrics but no {rundir.CONFIG_FILE}; refusing to write into it"
            )
        rundir.write_text(config_path, config_yaml, overwrite=False)
        env = {
            **run_environment.environment(cfg.trainer.num_threads),
            "machine": decision.record(),
            "model_loaded": loaded_models(cfg, decision),
        }
        rundir.write_json(run_dir / rundir.ENV_FILE, env, overwrite=False)
        return RunState(run_dir, None, False)
    # A re-launch of the same config (resume=true, a requeued cluster job, the same command again) continues
    # the run; any other config is refused, so one directory never mixes two runs.
    saved = rundir.load_config(config_path)
    current = OmegaConf.to_container(OmegaConf.create(config_yaml), resolve=True)
    assert isinstance(current, dict), "config_yaml is a config's YAML: a mapping"
    diff = rundir.config_differences(saved, current)
    if diff:
        raise RunDirError(
            f"{run_dir} already holds a run started with a different config (differing keys: {', '.join(diff)}); "
            "choose another run_dir (e.g. another seed or experiment). Nothing was changed."
        )
    if records.is_done(run_dir):  # nothing will run: no resume to record (timing would count it as a stretch)
        return run_state(run_dir)
    env_path = run_dir / rundir.ENV_FILE
    env = rundir.read_json(env_path) if env_path.exists() else {}
    started_with = env.get("world_size", 1)
    if started_with != distributed.world_size():
        _warn(
            f"{run_dir} was started on {started_with} process(es) and continues on "
            f"{distributed.world_size()}: the global batch is the same, but the random streams of the processes "
            "differ, so the continuation is not the one an uninterrupted run would have computed"
        )
    resumed_on = run_environment.environment(cfg.trainer.num_threads)
    _warn_if_numeric_path_changed(run_dir, env, resumed_on)
    env.setdefault("resumes", []).append(resumed_on)
    rundir.write_json(env_path, env)
    return run_state(run_dir)


def _warn_if_numeric_path_changed(run_dir: Path, started: dict[str, Any], resumed: dict[str, Any]) -> None:
    """A run continued on another CPU numeric path (instruction set, kernel variables) says so, as one continued on
    another number of processes does."""
    from atr_grpo.numeric_paths import numeric_path

    if "device" not in started:
        return
    before, now = numeric_path(started["device"]), numeric_path(resumed["device"])
    if before != now:
        _warn(
            f"{run_dir} was started on the numeric path {before} and continues on {now}: float results "
            "differ by kernel, so the continuation is not the one an uninterrupted run would have computed"
        )


# ------------------------------------------------------------------------------------------ checks
def clipping_can_act(cfg: TrainConfig) -> bool:
    return RULES[cfg.clipping.name].acts_on_policy or cfg.optimizer_steps_per_rollout > 1


def warn_if_on_policy(cfg: TrainConfig) -> str | None:
    """The warning of a run whose clipping rule cannot change a single gradient (printed to stderr)."""
    if clipping_can_act(cfg):
        return None
    message = (
        f"every update of this run is on-policy (rollout.steps_per_generation = "
        f"trainer.gradient_accumulation_steps = {cfg.trainer.gradient_accumulation_steps} and "
        f"rollout.num_iterations = 1), so w ≡ 1 and the clipping rule {cfg.clipping.name!r} cannot act: every "
        "ratio-based rule gives the same gradient. Use rollout=reuse2 or raise rollout.num_iterations."
    )
    _warn(message)
    return message


def warn_if_truncated_sampling(cfg: TrainConfig) -> str | None:
    """The warning of a run allowed to train on truncated sampling (`trainer.allow_truncated_sampling`)."""
    setting = truncated_sampling(cfg.trainer)
    if setting is None:
        return None
    message = (
        f"{setting} truncates the training sampler (trainer.allow_truncated_sampling=true): tokens are drawn "
        "from a renormalised part of π_old, so the rule's ratio and the rollout correction carry the kept mass as if "
        "it were a policy change. rollout/ratio_outside_box_frac logs the share of π_old/π_rollout outside the "
        "rule's box."
    )
    _warn(message)
    return message


def _warn(message: str) -> None:
    """A warning, shown once: by the console's log handler (Hydra's, or Python's last resort on stderr when none is
    set up) and written to the run's log file."""
    log.warning(message)


def check_processes(cfg: TrainConfig) -> None:
    """What a launch on several processes needs: a global batch they can share, and an evaluation that the
    main process can run alone (a ZeRO-3 model is sharded over all of them)."""
    if not distributed.launched():
        return
    tr = cfg.trainer
    processes = distributed.world_size()
    distributed.process_batch(
        tr.per_device_train_batch_size, tr.gradient_accumulation_steps, cfg.steps_per_generation, processes
    )
    zero_stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    if cfg.eval.enabled and cfg.eval.when == "during" and zero_stage == "3":
        raise ConfigError(
            "invalid config: eval.when='during' evaluates on the main process alone, which a DeepSpeed ZeRO-3 "
            "model (sharded over every process) cannot do; use eval.when=after"
        )


def preflight(cfg: TrainConfig) -> Decision:
    """Everything that can be refused before a model is loaded; returns what the run runs on."""
    from atr_grpo.model_checks import check_lora_targets
    from atr_grpo.numeric_paths import check_kernel_choice
    from atr_grpo.training.evaluations import check_evaluation_fits
    from atr_grpo.training.vllm_server import check_rollout_server

    with interrupts.stage("the checks before the run"):
        check_kernel_choice()
        decision = decide(cfg)
        check_lora_targets(cfg.model)
        check_processes(cfg)
        check_evaluation_fits(cfg, decision.evaluation_backend)
        check_rollout_server(cfg.rollout, decision.rollout_engine)
    return decision


# ------------------------------------------------------------------------------------------ the run
@dataclass
class RunOutcome:
    """How a run ended: trained to its last step or not, and where its scheduled evaluations stand."""

    run_dir: Path
    trained: bool
    evaluation: EvaluationState | None
    already_finished: bool = False  # training had finished before this launch: it trained nothing

    @property
    def ok(self) -> bool:
        return self.trained and (self.evaluation is None or self.evaluation.complete)

    def summary(self) -> str:
        done = "training finished" if self.trained else "training did not finish"
        if self.already_finished:
            done = "training already finished"
        evaluations = "" if self.evaluation is None else f"; {self.evaluation.describe()}"
        line = f"{self.run_dir}: {done}{evaluations}"
        if not self.ok and self.evaluation is not None and self.evaluation.failed:
            line += f" (errors in {layout.failures_path(self.run_dir)}; re-launch the same command to retry)"
        return ("" if self.ok else "NOT COMPLETE: ") + line


def run_outcome(run_dir: Path, already_finished: bool = False) -> RunOutcome:
    config = rundir.load_config(run_dir / rundir.CONFIG_FILE)
    return RunOutcome(run_dir, records.is_done(run_dir), run_evaluation_state(run_dir, config), already_finished)


def _prepared(cfg: TrainConfig, config_yaml: str, decision: Decision) -> RunState:
    """The run directory: locked and prepared by the main process, its state shared with the others."""
    return distributed.on_main(lambda: _lock_and_prepare(cfg, config_yaml, decision))


def _lock_and_prepare(cfg: TrainConfig, config_yaml: str, decision: Decision) -> RunState:
    """One process per run directory: its lock is taken before anything is written to it (a second launch is
    refused, naming the holder), and held until the run returns (`_gives_back_run_lock`) or this process ends."""
    warning = rundir.lock_run_dir(cfg.run_dir)
    if warning:
        _warn(warning)
    return prepare_run_dir(cfg, config_yaml, decision)


def _gives_back_run_lock(run: Callable[..., T]) -> Callable[..., T]:
    """`run(cfg, ...)` gives the run directory's lock back when it returns or raises, so that a test or notebook
    can run the same folder again, from another process too."""

    @functools.wraps(run)
    def locked_for_the_run(cfg: TrainConfig, *args: Any, **kwargs: Any) -> T:
        try:
            return run(cfg, *args, **kwargs)
        finally:
            rundir.unlock_run_dir(cfg.run_dir)

    return locked_for_the_run


@_gives_back_run_lock
def run_pipeline(cfg: TrainConfig, config_yaml: str) -> RunOutcome | None:
    """`python -m atr_grpo.train`: the whole run, or what is left of it (a finished run's pending evaluations).

    Returns None on the processes of a launched run other than the main one: their part ends with training.
    """
    from atr_grpo.training.stage_process import StageError, run_stage

    decision = preflight(cfg)  # before the process group: a refused config never waits for the other processes
    # GRPO in this process, or (eval.when=after, not launched) in a process of its own, whose memory is all given
    # back before the evaluation stage
    trains_here = not (cfg.eval.enabled and cfg.eval.when == "after") or distributed.launched()
    if trains_here:
        import_only_what_runs(decision)
    with distributed.process_group(cfg.trainer.ddp_timeout):
        state = _prepared(cfg, config_yaml, decision)
        # a finished run trains nothing, and its last line (`RunOutcome.summary`) says so
        if not state.finished and trains_here:  # (launched: these processes are the GRPO stage)
            train_grpo(cfg, state, decision)
        elif not state.finished:
            run_stage("grpo", state.run_dir, decision)
    if not distributed.is_main():
        return None
    if distributed.launched():
        _release_memory()  # the evaluation stage below shares this process's GPU
    if cfg.eval.enabled and saved_adapters(state.run_dir):
        try:
            run_stage("evaluate", state.run_dir)
        except StageError as err:  # the process died before it could record its failures: record them here
            for step in sorted(saved_adapters(state.run_dir)):
                record_failure(state.run_dir, step, "after", err)
    return run_outcome(state.run_dir, state.finished)  # its caller prints `outcome.summary()`, the run's last line


def import_only_what_runs(decision: Decision) -> None:
    """For a process that runs one GRPO run and nothing else (`python -m atr_grpo.train`, its GRPO stage): a run on
    TRL's path with HF rollouts keeps vLLM out of TRL's import (`compat.keep_vllm_out_of_trl`). Not for a process
    that may train another config afterwards (a test, a notebook), which could then not roll out with vLLM."""
    if decision.training_backend == "trl" and decision.rollout_engine == "hf":
        from atr_grpo.compat import keep_vllm_out_of_trl

        keep_vllm_out_of_trl()


def _release_memory() -> None:
    """Give back what the finished trainer held (a colocated vLLM engine may keep part of its memory)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@_gives_back_run_lock
def run_training(cfg: TrainConfig, config_yaml: str, callbacks: Sequence[Any] = ()) -> Path:
    """Run (or resume, or skip when finished) the GRPO stage in this process; returns the run directory.

    `callbacks`: extra transformers `TrainerCallback`s (e.g. a user's probe), added after ours. With
    eval.when=after the adapters to evaluate are left in eval/adapters/ (`evaluations.evaluate_saved_adapters`).
    Under a launcher, every process calls it and trains its share.
    """
    decision = preflight(cfg)
    with distributed.process_group(cfg.trainer.ddp_timeout):
        state = _prepared(cfg, config_yaml, decision)
        if state.finished:
            print(f"{state.run_dir}: already finished; nothing to do")
            return state.run_dir
        train_grpo(cfg, state, decision, callbacks)
    return state.run_dir


def _record_start(cfg: TrainConfig, state: RunState, adapter: Path | None) -> None:
    """What the main process writes before GRPO starts: the start point (the SFT adapter), and, on a resume, the
    metric lines of the steps it will redo set aside."""
    from atr_grpo.provenance import record_start_point, start_point
    from atr_grpo.training.run_logger import truncate_metrics

    warning = record_start_point(state.run_dir, start_point(cfg, adapter))
    if warning:
        _warn(warning)
    # a run killed before its first (complete) checkpoint starts again from step 0
    last_step = 0 if state.resume_from is None else int(state.resume_from.name.split("-")[-1])
    moved = truncate_metrics(state.run_dir, last_step)
    if state.resume_from is not None or moved:
        log.info("resuming from %s (%d metric lines set aside)", state.resume_from or "step 0", moved)


def train_grpo(cfg: TrainConfig, state: RunState, decision: Decision, callbacks: Sequence[Any] = ()) -> None:
    """The GRPO stage of a prepared run directory (preflight done) on `decision`'s backends: SFT adapter, trainer,
    training, DONE."""
    backend, engine = decision.training_backend, decision.rollout_engine
    if backend == "unsloth":
        import unsloth  # noqa: F401  (first: it patches transformers and rewrites trl's GRPOTrainer)
    from transformers import set_seed

    from atr_grpo.console import GRPO_SHOWN
    from atr_grpo.training.evaluations import build_eval_callback, save_trainable
    from atr_grpo.training.progress import attach_progress
    from atr_grpo.training.run_logger import MetricsCallback, RunLogger
    from atr_grpo.training.sft import ensure_sft_adapter
    from atr_grpo.training.stage_process import STAGE_NAMES

    rule = cfg.clipping.rule()  # the rule the config validated: built once in this process
    warn_if_on_policy(cfg)
    warn_if_truncated_sampling(cfg)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    set_seed(cfg.seed)
    started = time.time()

    # built by one process per machine (in a process of its own), then read by all
    adapter = distributed.main_first(lambda: ensure_sft_adapter(cfg)) if cfg.sft.enabled else None
    main = distributed.is_main()  # the one process that writes run files
    if main:
        _record_start(cfg, state, adapter)
    logger = RunLogger(cfg, state.run_dir) if main else None
    try:
        if backend == "unsloth":
            from atr_grpo.training.unsloth_trainer import build_unsloth_trainer

            trainer, tokenizer = build_unsloth_trainer(cfg, rule, adapter, state.run_dir, engine)
        else:
            from atr_grpo.training.trl_backend import build_trl_trainer

            trainer, tokenizer = build_trl_trainer(cfg, rule, adapter, state.run_dir, engine)
        if logger is not None:
            trainer.add_callback(MetricsCallback(logger))
        attach_progress(trainer, "GRPO", GRPO_SHOWN)  # every process: only rank 0 draws the line, none prints dicts
        if cfg.eval.enabled:
            trainer.add_callback(build_eval_callback(cfg, trainer, tokenizer, state.run_dir, logger, decision))
        for callback in callbacks:
            trainer.add_callback(callback)
        with interrupts.stage(STAGE_NAMES["grpo"]):
            trainer.train(resume_from_checkpoint=str(state.resume_from) if state.resume_from else None)
        final = state.run_dir / layout.FINAL_ADAPTER
        if distributed.on_main(lambda: not final.exists()):  # one decision: saving may need every process
            save_trainable(trainer, final)
        done = records.Done(
            step=trainer.state.global_step,
            seconds=round(time.time() - started, 1),
            backend=backend,
            rollout_engine=engine,
            world_size=distributed.world_size(),
        )
        distributed.on_main(lambda: records.write_done(state.run_dir, done))
    finally:
        if logger is not None:
            logger.finish(exit_code=0 if sys.exc_info()[0] is None else 1)  # a killed run shows as failed in W&B
