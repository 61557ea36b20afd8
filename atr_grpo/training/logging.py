"""Per-step metrics: `metrics.jsonl` in the run directory (the truth) and W&B (a mirror with the same keys)."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from atr_grpo import rundir
from atr_grpo.config import TrainConfig
from atr_grpo.wandb_auth import api_key_available

log = logging.getLogger(__name__)

# TRL's names → the run files' names (README, "Runs"; the originals are kept as well)
RENAMED = {"completions/mean_length": "completion_length"}
# end-of-training summaries are not per-step metrics
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss")
# Unsloth's trainer logs PPO clip statistics computed with TRL's default ε = 0.2 whatever the rule is; they
# would sit beside the rule's own `clip/*` and be read as the rule's, so they are not recorded. With vLLM
# rollouts TRL (at generation, with its own correction) and Unsloth (in the loss, from ours) both log
# `sampling/*` under the same names, averaged together: the rule's `rollout/*` keys measure the engine's
# mismatch and the correction's weight, with one meaning on both paths
MISLEADING_PREFIXES = ("clip_ratio/", "sampling/")
WANDB_ID_FILE = "wandb_run_id"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunLogger:
    """Writes one JSON object per logged step; mirrors it to W&B when `logger.name == "wandb"`."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / rundir.METRICS_FILE
        self.wandb_run = None
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
        id_file = self.run_dir / WANDB_ID_FILE
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
        )
        if run_id is None:
            rundir.write_text(id_file, run.id + "\n")
        log.info("W&B run %s (%s)", run.id, run.settings.mode)
        return run

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
        rundir.append_jsonl(self.metrics_path, record)
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=int(step))

    def log_eval(self, metrics: dict[str, float], step: int) -> None:
        """Evaluation metrics go to W&B only: their source of truth is eval/summary.jsonl."""
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=int(step))

    def finish(self, exit_code: int = 0) -> None:
        """Closes the W&B run; a nonzero `exit_code` (training raised) marks it failed there, not finished."""
        if self.wandb_run is not None:
            self.wandb_run.finish(exit_code=exit_code)
            self.wandb_run = None


def _config_dict(cfg: TrainConfig) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]


class MetricsCallback(TrainerCallback):
    """Forwards each of the trainer's log events to the RunLogger under the project's metric names."""

    def __init__(self, logger: RunLogger) -> None:
        self.logger = logger

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
        if not logs:
            return
        if any(key in logs for key in SUMMARY_KEYS):
            rundir.write_json(self.logger.run_dir / "train_summary.json", {"step": state.global_step, **logs})
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
    path = Path(run_dir) / rundir.METRICS_FILE
    if not path.exists():
        return 0
    records = rundir.read_jsonl(path)
    keep = [r for r in records if r.get("step", 0) <= last_step]
    moved = [r for r in records if r.get("step", 0) > last_step]
    if moved:
        rundir.append_jsonl(Path(run_dir) / "metrics.discarded.jsonl", moved)
        text = "".join(json.dumps(r) + "\n" for r in keep)
        rundir.write_text(path, text)
    return len(moved)
