"""Per-step metrics: `metrics.jsonl` in the run directory (the truth) and W&B (a mirror with the same keys).

Evaluations reach the same W&B run from either place they run: the training process (eval.when=during,
`RunLogger.log_eval`) or the evaluation stage after training (eval.when=after, `EvaluationMirror`). Their `eval/*`
keys are plotted against `eval/step` (the training step of the evaluated adapter), never against W&B's own step,
which the stage cannot reuse: W&B drops a row whose step is lower than one it already has, and training used
0..max_steps. `wandb_eval.jsonl` in the run directory lists each evaluation step mirrored to a W&B run (at which
W&B step) and each failed attempt; a step is mirrored once per W&B run, however often it is evaluated.
An evaluation's W&B row also holds each metric's standard error (`eval/<benchmark>/mean@K_stderr`) and, per
benchmark, a table of up to `logger.eval_completions` samples (`eval/<benchmark>/completions`: problem id, sample,
prompt, completion, gold, extracted answer, status), read from the per-sample files (`outputs.completion_rows`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from atr_grpo import rundir
from atr_grpo.config import TrainConfig
from atr_grpo.evaluation.runner import EVAL_STEP
from atr_grpo.rundir import layout
from atr_grpo.rundir.records import MetricsLine, metrics_lines
from atr_grpo.wandb_auth import api_key_available

log = logging.getLogger(__name__)

# TRL's names → the run files' names (docs/runs.md; the originals are kept as well)
RENAMED = {"completions/mean_length": "completion_length"}
# end-of-training summaries are not per-step metrics
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss")
# Unsloth's trainer logs PPO clip statistics computed with TRL's default ε = 0.2 whatever the rule is; they
# would sit beside the rule's own `clip/*` and be read as the rule's, so they are not recorded. With vLLM
# rollouts TRL (at generation, with its own correction) and Unsloth (in the loss, from ours) both log
# `sampling/*` under the same names, averaged together: the rule's `rollout/*` keys measure the engine's
# mismatch and the correction's weight, with one meaning on both paths
MISLEADING_PREFIXES = ("clip_ratio/", "sampling/")
OFFLINE_MODES = ("offline", "dryrun")  # W&B's modes that keep a run on disk, for `wandb sync`


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLogger:
    """Writes one JSON object per logged step; mirrors it to W&B when `logger.name == "wandb"`."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / layout.METRICS_FILE
        self.wandb_run = None
        self.eval_completions = cfg.logger.eval_completions
        if cfg.logger.name == "wandb":
            self.wandb_run = self._start_wandb(cfg)

    def _start_wandb(self, cfg: TrainConfig) -> Any:
        import wandb

        lg = cfg.logger
        mode = lg.mode
        if mode == "auto" and os.environ.get("WANDB_MODE"):
            mode = None  # W&B reads WANDB_MODE itself (a mode passed to wandb.init would override it)
        elif mode == "auto":  # online only when credentials exist; never prompt
            mode = "online" if api_key_available() else "offline"
        id_file = self.run_dir / layout.WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else None  # None: W&B draws a new id
        run = wandb.init(
            project=lg.project,
            entity=lg.entity,
            group=lg.group or cfg.experiment,
            name=cfg.run_name,
            tags=[f"model:{cfg.model.name}", f"method:{cfg.method}", f"seed:{cfg.seed}", *lg.tags],
            config=_config_dict(cfg),
            dir=str(self.run_dir),
            id=run_id,
            resume="allow",  # a relaunch into the same run_dir continues the same W&B run
            mode=mode,
            settings=_console_settings(mode),
        )
        if run_id is None:
            rundir.write_text(id_file, run.id + "\n")
        run.define_metric(EVAL_STEP, hidden=True)
        run.define_metric("eval/*", step_metric=EVAL_STEP)  # W&B's globs are prefixes: every evaluation key
        log.info("W&B run %s (%s)", run.id, run.settings.mode)
        return run

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = MetricsLine(int(step), {k: _clean(v) for k, v in metrics.items()}).to_dict()
        rundir.append_jsonl(self.metrics_path, record)
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=int(step))

    def log_eval(self, metrics: dict[str, float], step: int, wandb_step: int | None = None) -> bool:
        """Evaluation metrics go to W&B only (their source of truth is eval/summary.jsonl), with `eval/step` = `step`,
        at W&B step `wandb_step` (default: `step`, as during training). A step this W&B run already holds is not
        logged again (returns False): a re-evaluation on relaunch adds no second point."""
        if self.wandb_run is None:
            return False
        if step in mirrored_steps(self.run_dir, self.wandb_run.id):
            log.info("W&B already holds the evaluation of step %d; not logged again", step)
            return False
        wandb_step = int(step if wandb_step is None else wandb_step)
        self.wandb_run.log({EVAL_STEP: int(step), **metrics, **self._completion_tables(step)}, step=wandb_step)
        record = {"step": int(step), "wandb_step": wandb_step, "run_id": self.wandb_run.id}
        rundir.append_jsonl(self.run_dir / layout.WANDB_EVAL_FILE, record)
        return True

    def _completion_tables(self, step: int) -> dict[str, Any]:
        """`eval/<benchmark>/completions`: a W&B table of each benchmark evaluated at `step` (eval/summary.jsonl),
        from its per-sample file; none when logger.eval_completions is 0."""
        import wandb

        from atr_grpo.evaluation.outputs import COMPLETION_COLUMNS, completion_rows, read_summary

        if self.eval_completions == 0:
            return {}
        tables = {}
        for done_step, benchmark in read_summary(self.run_dir):
            rows = completion_rows(self.run_dir, step, benchmark, self.eval_completions) if done_step == step else []
            if rows:
                data = [[row[column] for column in COMPLETION_COLUMNS] for row in rows]
                table = wandb.Table(columns=list(COMPLETION_COLUMNS), data=data, allow_mixed_types=True)  # None answers
                tables[f"eval/{benchmark}/completions"] = table
        return tables

    def finish(self, exit_code: int = 0) -> None:
        """Closes the W&B run; a nonzero `exit_code` (training raised) marks it failed there, not finished. An
        offline run is named with every folder it has so far (one per process that wrote it: W&B cannot reuse one)
        in the one `wandb sync` command that uploads them all (W&B's own hint, silenced by `_console_settings`, named
        this process's folder only)."""
        if self.wandb_run is not None:
            run, self.wandb_run = self.wandb_run, None
            run.finish(exit_code=exit_code)
            if run.settings.mode in OFFLINE_MODES:
                log.info("W&B offline run %s: `%s` uploads all of it", run.id, wandb_sync_command(self.run_dir, run.id))


def wandb_sync_command(run_dir: str | Path, run_id: str) -> str:
    """`wandb sync <folder> ...`: every offline folder of the W&B run `run_id`, in start order, which W&B uploads
    as one run in that order."""
    return shlex.join(["wandb", "sync", *map(str, layout.wandb_offline_folders(run_dir, run_id))])


def _console_settings(mode: str | None) -> Any:
    """W&B's console kept to its start lines: no history and summary at the end (`quiet`: metrics.jsonl holds every
    value) and, for an offline run, no warnings: TRL asks the run for its URL at every checkpoint, and each time W&B
    warns that an offline run has none. W&B reads its console settings once per process (`wandb.termsetup`, at its
    setup), so they are set there too."""
    import wandb

    offline = (mode or os.environ.get("WANDB_MODE") or "online") in OFFLINE_MODES
    settings = wandb.Settings(quiet=True, show_warnings=not offline)
    wandb.termsetup(wandb.setup().settings.model_copy(update={"show_warnings": settings.show_warnings}), None)
    return settings


def _records(path: Path) -> list[dict[str, Any]]:
    return rundir.read_jsonl(path) if path.exists() else []


def mirrored_steps(run_dir: str | Path, run_id: str | None) -> set[int]:
    """The evaluation steps the W&B run `run_id` holds, by `wandb_eval.jsonl` (none for a run not started yet)."""
    records = _records(Path(run_dir) / layout.WANDB_EVAL_FILE)
    return {int(r["step"]) for r in records if run_id is not None and r.get("run_id") == run_id and "wandb_step" in r}


def next_wandb_step(run_dir: str | Path, run: Any) -> int:
    """A W&B step above every one the run has used: the server's count for a resumed online run (`starting_step`;
    0 offline) and, from the run directory, the training steps logged (kept or set aside) and mirrored evaluations."""
    run_dir = Path(run_dir)
    used = [
        int(r["step"])
        for name in (layout.METRICS_FILE, layout.DISCARDED_METRICS_FILE)
        for r in _records(run_dir / name)
    ]
    used += [
        int(r["wandb_step"])
        for r in _records(run_dir / layout.WANDB_EVAL_FILE)
        if r.get("run_id") == run.id and "wandb_step" in r
    ]
    return max([int(run.starting_step), *(step + 1 for step in used)])


class EvaluationMirror:
    """The evaluation stage's W&B mirror (logger=wandb): each evaluated step into the W&B run of training (the id in
    `wandb_run_id`, resumed), with the keys the training process logs for an evaluation, at W&B steps above all the
    run has used. Given the steps eval/summary.jsonl holds in full, it first mirrors those W&B lacks (a stage that
    crashed between the two, an earlier W&B failure). W&B is started only when there is something to log.

    W&B is a mirror: its failure never stops or undoes an evaluation. It is logged as an error, recorded in
    `wandb_eval.jsonl`, and `close` names the steps W&B lacks and the command that mirrors them; a failed start
    ends the mirror for this process (no retry per adapter)."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, done_steps: Iterable[int] = ()) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.wanted = cfg.logger.name == "wandb"
        self.logger: RunLogger | None = None
        self.start_failed = False
        self.next_step = 0
        self.missed: list[int] = []  # steps W&B did not get in this process
        if not self.wanted:
            return
        id_file = self.run_dir / layout.WANDB_ID_FILE
        already = mirrored_steps(self.run_dir, id_file.read_text().strip() if id_file.exists() else None)
        for step in sorted(set(done_steps) - already):
            self.log(step, self._recorded(step))

    def _recorded(self, step: int) -> dict[str, float]:
        """A step's metrics from eval/summary.jsonl: what its evaluation returned."""
        from atr_grpo.evaluation.outputs import read_summary
        from atr_grpo.evaluation.runner import flat_metrics

        summary = read_summary(self.run_dir)
        return flat_metrics({name: summary[(step, name)] for name in self.cfg.eval.benchmarks}, self.cfg.eval.k)

    def _start(self) -> RunLogger:
        logger = RunLogger(self.cfg, self.run_dir)
        try:
            self.next_step = next_wandb_step(self.run_dir, logger.wandb_run)
        except Exception:
            logger.finish(exit_code=1)
            raise
        return logger

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.wanted:
            return
        if self.start_failed:
            self.missed.append(step)
            return
        try:
            if self.logger is None:
                self.logger = self._start()
            if self.logger.log_eval(metrics, step, wandb_step=self.next_step):
                self.next_step += 1
        except Exception as err:  # shown and recorded; the evaluation files stay the truth
            self.start_failed = self.logger is None
            self._fail(step, "starting the W&B run" if self.start_failed else "logging to W&B", err)

    def _fail(self, step: int | None, what: str, error: BaseException) -> None:
        if step is not None:
            self.missed.append(step)
        log.error("%s failed (step %s); the evaluation files hold every result", what, step, exc_info=error)
        record = {
            "step": step,
            "error": f"{what}: {type(error).__name__}: {error}",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        rundir.append_jsonl(self.run_dir / layout.WANDB_EVAL_FILE, record)

    def close(self) -> None:
        """Finish the W&B run (an exception that ends the process marks it failed there, by W&B's own exit hook),
        then name the steps W&B lacks."""
        if self.logger is not None:
            try:
                self.logger.finish()
            except Exception as err:
                self._fail(None, "finishing the W&B run", err)
            self.logger = None
        if self.missed:
            log.error(
                "W&B lacks the evaluations of steps %s (%s says why); %s has them, and "
                "`python -m atr_grpo.training.stages evaluate %s` mirrors them",
                sorted(set(self.missed)),
                self.run_dir / layout.WANDB_EVAL_FILE,
                layout.summary_path(self.run_dir),
                self.run_dir,
            )


def _config_dict(cfg: TrainConfig) -> dict[Any, Any]:
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(config, dict)  # a dataclass's fields
    return config


class MetricsCallback(TrainerCallback):
    """Forwards each of the trainer's log events to the RunLogger under the project's metric names."""

    def __init__(self, logger: RunLogger) -> None:
        self.logger = logger

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if not logs:
            return
        if any(key in logs for key in SUMMARY_KEYS):
            rundir.write_json(self.logger.run_dir / layout.TRAIN_SUMMARY_FILE, {"step": state.global_step, **logs})
            return
        metrics = {k: v for k, v in logs.items() if not k.startswith(MISLEADING_PREFIXES)}
        for old, new in RENAMED.items():
            if old in metrics:
                metrics[new] = metrics[old]
        self.logger.log(state.global_step, metrics)


def truncate_metrics(run_dir: str | Path, last_step: int) -> int:
    """On resume from a checkpoint at `last_step`, set aside metric lines logged after it.

    They belong to updates that are about to be recomputed; they move to `metrics.discarded.jsonl`
    (appended, never deleted) so metrics.jsonl reads as one uninterrupted run. Returns how many moved.
    """
    path = Path(run_dir) / layout.METRICS_FILE
    records = metrics_lines(path)  # a step logged twice is refused: the resume would keep both
    if not records:
        return 0
    keep = [r for r in records if r.get("step", 0) <= last_step]
    moved = [r for r in records if r.get("step", 0) > last_step]
    if moved:
        rundir.append_jsonl(Path(run_dir) / layout.DISCARDED_METRICS_FILE, moved)
        text = "".join(json.dumps(r) + "\n" for r in keep)
        rundir.write_text(path, text)
    return len(moved)
