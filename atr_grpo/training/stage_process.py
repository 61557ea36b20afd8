"""Starting a stage of a training run in a process of its own, and waiting for it.

The child's side, what `python -m atr_grpo.training.stages STAGE PATH` runs, is `training/stages.py`; this
module only spawns it, so that the pipeline and the SFT stage can start a stage without importing each other.
What the child needs crosses by one channel, the folder PATH: the run's config.yaml and, while a GRPO stage that
its parent decided for runs, the parent's decision (DECISION_FILE). Only the parent's pid travels in the
environment (PARENT_ENV), for the stage to die with it.

A stage dies with the process that started it (`die_with_parent`, on Linux): a run killed with `kill -9` during SFT
leaves no SFT process training on, beside the relaunch, into the same staging folder.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from atr_grpo import rundir
from atr_grpo.distributed import stage_environment
from atr_grpo.machine import Decision
from atr_grpo.training import interrupts

STAGES = ("sft", "grpo", "evaluate")
STAGE_NAMES = {"sft": "the SFT stage", "grpo": "GRPO training", "evaluate": "the evaluation stage"}  # Ctrl-C's line
RUN_CONFIG = "run_config.yaml"  # the config an SFT stage process is given, in its staging folder
STAGE_MODULE = "atr_grpo.training.stages"  # the child's entry point
DECISION_FILE = rundir.layout.STAGE_DECISION_FILE
PARENT_ENV = "ATR_GRPO_STAGE_PARENT"  # the pid of the process that started the stage, which the stage dies with
EXIT_INTERRUPTED = interrupts.EXIT_INTERRUPTED
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal this process gets when the thread that started it ends


class StageError(RuntimeError):
    """A stage process failed; its own output (above) says why."""


def run_stage(stage: str, path: Path, decision: Decision | None = None) -> None:
    """Run one stage in a fresh Python process and wait for it; raises StageError if it fails, KeyboardInterrupt
    if it was interrupted (Ctrl-C reaches the stage and this process alike). `decision`: what
    this process decided the stage runs on, passed down so that the stage neither decides nor logs it again."""
    command = [sys.executable, "-m", STAGE_MODULE, stage, str(path)]
    env = {**stage_environment(), "PYTHONUNBUFFERED": "1"}
    handed = path / DECISION_FILE
    handed.unlink(missing_ok=True)  # only ever this process's own decision
    if decision is not None:
        rundir.write_text(handed, decision.to_json())
    env[PARENT_ENV] = str(os.getpid())
    with interrupts.stage(STAGE_NAMES[stage]):
        try:
            result = subprocess.run(command, env=env)
        finally:
            handed.unlink(missing_ok=True)  # a stage started by hand later decides for itself
        if result.returncode in (EXIT_INTERRUPTED, -signal.SIGINT):  # Ctrl-C reached the stage alone
            raise KeyboardInterrupt
    if result.returncode != 0:
        raise StageError(f"the {stage} stage of {path} failed (exit status {result.returncode}); its output is above")


def handed_decision(path: Path) -> Decision | None:
    """The decision the parent left in `path` for this stage process; None for a stage started by hand."""
    handed = path / DECISION_FILE
    return Decision.from_json(handed.read_text(encoding="utf-8")) if handed.exists() else None


def die_with_parent() -> bool:
    """In a stage process, first thing: ask the OS to kill it (SIGKILL) when the process that started it ends,
    however that ends. False when that process has ended already (the stage must not run); True otherwise, and on a
    system without `prctl` or a process not started by `run_stage`, where nothing is done. The signal comes when the
    starting *thread* ends: `run_stage` is called from a run's main thread."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None or not sys.platform.startswith("linux"):
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        print(f"warning: prctl(PR_SET_PDEATHSIG) failed ({os.strerror(ctypes.get_errno())})", file=sys.stderr)
    return os.getppid() == int(parent)  # else the parent ended before prctl, and no signal will come
