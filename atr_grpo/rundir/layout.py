"""Every file and folder name of a run directory, and the paths built from them. No other module spells one.

    <run_dir>/
      run.lock                    one process per run: the lock its launch holds, naming its pid and host (`lock`)
      config.yaml                 the run's fully resolved config
      env.json                    package versions, git commit, python, device, number of processes, start time
      metrics.jsonl               one JSON object per logged training step
      metrics.discarded.jsonl     metric lines set aside on resume (logged after the checkpoint resumed from)
      train_summary.json          the trainer's end-of-training summary (runtime, mean loss, prompts seen)
      DONE                        written when training reached its last step (`records.Done`)
      final_adapter/              the adapter at the last step
      wandb_run_id                the W&B run this run mirrors to
      wandb_eval.jsonl            the evaluation steps mirrored to W&B, and failed attempts
      checkpoints/checkpoint-<N>/ trainer checkpoints (resume continues from the newest), with delta_control.json
                                  and prompts_seen.json
      eval/step_<N:06d>/<benchmark>.jsonl   one line per (problem, sample), or its packed `.jsonl.gz`
      eval/summary.jsonl          one line per (step, benchmark): the commit record of an evaluation
      eval/request.json           a standalone evaluation folder's one model and request (`evaluation.store`)
      eval/adapters/step_<N:06d>/ the adapter of a scheduled step, kept until its evaluation is recorded
      eval/failures.jsonl         one line per failed evaluation attempt, with its traceback
      eval/regrade/<tag>/         a regrade: summary.jsonl, step_<N:06d>/<benchmark>.jsonl, grader.json, changes.jsonl

A folder is written under a staging name (`<name>.partial`, `checkpoints/.partial-checkpoint-<N>`) and renamed into
place, so a reader never sees half of one. A JSONL file's torn last line is kept in `<name>.torn`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from atr_grpo.rundir.errors import RunFileError

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.yaml"
ENV_FILE = "env.json"
METRICS_FILE = "metrics.jsonl"
DISCARDED_METRICS_FILE = "metrics.discarded.jsonl"
TRAIN_SUMMARY_FILE = "train_summary.json"
DONE_FILE = "DONE"
STAGE_DECISION_FILE = "stage_decision.json"  # a parent's backend decision, there while the stage it was made for runs
FINAL_ADAPTER = "final_adapter"
WANDB_ID_FILE = "wandb_run_id"
WANDB_EVAL_FILE = "wandb_eval.jsonl"
SWEEP_CONFIG_FILE = "multirun.yaml"  # Hydra's, in a sweep's folder (above run_dir), rewritten per sweep
WANDB_DIR = "wandb"  # W&B's own folder (its `dir` is the run directory): offline-run-<time>-<id>/ per process
CHECKPOINT_DIR = "checkpoints"
DELTA_STATE_FILE = "delta_control.json"  # adaptive δ's state, inside each checkpoint
PROMPTS_SEEN_FILE = "prompts_seen.json"  # each step's training prompt ids so far, inside each checkpoint
EVAL_DIR = "eval"
SUMMARY_FILE = "summary.jsonl"
REQUEST_FILE = "request.json"  # what a standalone evaluation folder holds: one model, one request
ADAPTERS_DIR = "adapters"
FAILURES_FILE = "failures.jsonl"
REGRADE_DIR = "regrade"
GRADER_FILE = "grader.json"
CHANGES_FILE = "changes.jsonl"
SAMPLES_SUFFIX = ".jsonl"
PACKED_SUFFIX = ".gz"
STEP_PREFIX = "step_"
STAGING_SUFFIX = ".partial"
TORN_SUFFIX = ".torn"


def step_name(step: int) -> str:
    """`step_000050`: the folder of one evaluated step."""
    return f"{STEP_PREFIX}{step:06d}"


def step_of(name: str) -> int | None:
    """The step of a `step_<N:06d>` folder name; None for any other name."""
    prefix, _, number = name.partition("_")
    return int(number) if prefix + "_" == STEP_PREFIX and number.isdigit() else None


def lock_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOCK_FILE


def config_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONFIG_FILE


def env_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / ENV_FILE


def metrics_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / METRICS_FILE


def done_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / DONE_FILE


def wandb_offline_folders(run_dir: str | Path, run_id: str) -> list[Path]:
    """The folders of an offline W&B run, in the order they were started. W&B cannot write into an existing one, so
    each process that continues the run (a relaunch, the evaluation stage) writes its own: `offline-run-<time>-<id>`,
    with `-<n>` after it when two start in one second. `wandb sync` given them all uploads them as one run."""
    name = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    folder = Path(run_dir) / WANDB_DIR
    started = {}  # folder → (its start second, its number within that second)
    for path in folder.glob("offline-run-*") if folder.is_dir() else []:
        match = name.fullmatch(path.name)
        if match:
            started[path] = (match[1], int(match[2] or 0))
    return sorted(started, key=started.__getitem__)


def sweep_config_copy(sweep_dir: str | Path, stamp: str) -> Path:
    """Where a sweep's multirun.yaml is kept once the sweep ends (`multirun.<stamp>.yaml`), before the next one
    into the same folder rewrites it."""
    return Path(sweep_dir) / f"multirun.{stamp}.yaml"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def eval_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / EVAL_DIR


def eval_step_dir(run_dir: str | Path, step: int) -> Path:
    return eval_dir(run_dir) / step_name(step)


def sample_file_in(folder: str | Path, step: int, benchmark: str) -> Path:
    """`<folder>/step_<N:06d>/<benchmark>.jsonl`: the per-sample file of one evaluation below an eval or regrade
    folder."""
    return Path(folder) / step_name(step) / f"{benchmark}{SAMPLES_SUFFIX}"


def sample_file(run_dir: str | Path, step: int, benchmark: str) -> Path:
    return sample_file_in(eval_dir(run_dir), step, benchmark)


def packed(path: Path) -> Path:
    """The compressed copy of a per-sample file (`<benchmark>.jsonl.gz`)."""
    return path.with_name(path.name + PACKED_SUFFIX)


def sample_files(run_dir: str | Path) -> list[Path]:
    """Every uncompressed per-sample file of a run, in a stable order."""
    return sorted(eval_dir(run_dir).glob(f"{STEP_PREFIX}*/*{SAMPLES_SUFFIX}"))


def summary_path(run_dir: str | Path) -> Path:
    return eval_dir(run_dir) / SUMMARY_FILE


def request_path(run_dir: str | Path) -> Path:
    return eval_dir(run_dir) / REQUEST_FILE


def adapters_dir(run_dir: str | Path) -> Path:
    return eval_dir(run_dir) / ADAPTERS_DIR


def adapter_dir(run_dir: str | Path, step: int) -> Path:
    return adapters_dir(run_dir) / step_name(step)


def failures_path(run_dir: str | Path) -> Path:
    return eval_dir(run_dir) / FAILURES_FILE


def regrades_dir(run_dir: str | Path) -> Path:
    return eval_dir(run_dir) / REGRADE_DIR


def regrade_dir(run_dir: str | Path, tag: str) -> Path:
    return regrades_dir(run_dir) / tag


def staging_dir(target: Path) -> Path:
    """The folder `target` is written under before it is renamed into place."""
    return target.with_name(target.name + STAGING_SUFFIX)


def torn_path(path: Path) -> Path:
    """Where a JSONL file's cut-off last line is kept."""
    return path.with_name(path.name + TORN_SUFFIX)


def is_run_dir(folder: str | Path) -> bool:
    """A run directory: a config.yaml and something a run wrote (an eval folder or metrics)."""
    folder = Path(folder)
    return config_path(folder).exists() and (eval_dir(folder).exists() or metrics_path(folder).exists())


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every run directory below `root`, recognised by its config.yaml, in a stable order, by the paths that reach
    them. Links to folders are followed (a run folder may be one); a link back to a folder it lies in (a loop), or
    a run reached by two paths (it would count twice), is a RunFileError naming the link."""
    root = Path(root)
    if not root.exists():
        return []
    found: dict[Path, Path] = {}  # real path → the path it was reached by

    def walk(folder: Path, ancestors: frozenset[Path]) -> None:
        real = folder.resolve()
        if real in ancestors:
            raise RunFileError(
                f"{folder}: a link to {real}, a folder it lies in (a loop); remove the link or point at another root"
            )
        if (folder / CONFIG_FILE).is_file():
            if real in found:
                raise RunFileError(
                    f"{folder}: the run {found[real]} again (a link to {real}), which would count twice; "
                    "remove the link or point at a root that reaches each run once"
                )
            found[real] = folder
        for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
            if entry.name != CHECKPOINT_DIR and entry.is_dir():  # is_dir follows links
                walk(Path(entry.path), ancestors | {real})

    walk(root, frozenset())
    return sorted(found.values())
