"""Ctrl-C's one line: the part of the run it stopped, what the run kept, and how to go on.

The parts a user waits through are marked with `stage(name)`: the checks before the run, building the tiny base
model, loading the model, building the data, the SFT stage, GRPO training, the evaluation stage. A Ctrl-C inside one
carries the innermost part's name up to the entry point, which prints `interrupted_message` instead of a traceback.
Outside every marked part the run is in its start-up (the run directory, W&B). A part whose work a Ctrl-C throws
away says so (`stage(name, loses=...)`), and the line repeats it. `python -m atr_grpo.evaluate` marks its parts
too and ends in `evaluation_interrupted_message`. Before the run's config is known (the imports, composing and
checking the config), `before_the_run` prints `BEFORE_THE_RUN` instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from atr_grpo.rundir.layout import METRICS_FILE, checkpoint_dir, summary_path
from atr_grpo.rundir.records import is_done, metrics_lines, summary_lines
from atr_grpo.training.checkpoints import latest_complete_checkpoint

START_UP = "start-up"  # the name of the time outside every marked part
_STAGE = "atr_grpo_stage"  # the attribute of a KeyboardInterrupt that names where it struck
EXIT_INTERRUPTED = 130  # the shell's status for a process ended by Ctrl-C (128 + SIGINT)
BEFORE_THE_RUN = "interrupted during start-up, before the run began; run the same command to start it"
_LOSSES: dict[str, str] = {}  # a part's name → what a Ctrl-C inside it throws away (`stage(name, loses=...)`)


@contextmanager
def before_the_run() -> Iterator[None]:
    """An entry point's start-up, before its run is known: a Ctrl-C prints `BEFORE_THE_RUN` and exits 130."""
    try:
        yield
    except KeyboardInterrupt:
        print(BEFORE_THE_RUN, file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


@contextmanager
def stage(name: str, loses: str = "") -> Iterator[None]:
    """Mark a part of the run: a Ctrl-C inside it is named `name`, unless a part inside this one named it first.
    `loses`: what such a Ctrl-C throws away, said in its line ("its pretraining so far is lost")."""
    if loses:
        _LOSSES[name] = loses
    try:
        yield
    except KeyboardInterrupt as interrupt:
        if not hasattr(interrupt, _STAGE):
            setattr(interrupt, _STAGE, name)
        raise


def interrupted_stage(interrupt: KeyboardInterrupt) -> str:
    """The part of the run `interrupt` stopped (`START_UP` outside every marked part)."""
    return getattr(interrupt, _STAGE, START_UP)


def interrupted_message(run_dir: str | Path, stage_name: str = START_UP) -> str:
    """The one line: the part interrupted, what it threw away, the step the run reached (its last line in
    metrics.jsonl), the checkpoint a relaunch continues from, and how to go on: resume from a checkpoint, or start
    again when none is kept. The run folder is named only once it exists. Resuming is exact (the tests check it),
    so nothing more needs saying."""
    run_dir = Path(run_dir)
    lost = f"; {_LOSSES[stage_name]}" if stage_name in _LOSSES else ""
    if not run_dir.is_dir():
        return (
            f"interrupted during {stage_name}, before the run folder was made{lost}; run the same command to start it"
        )
    try:
        steps = [line["step"] for line in metrics_lines(run_dir / METRICS_FILE)]
    except (OSError, ValueError):  # a damaged file is named when the run is relaunched
        steps = []
    kept = latest_complete_checkpoint(checkpoint_dir(run_dir), warn=False)
    reached = f"at step {steps[-1]}" if steps else "before the first GRPO step"
    if kept:
        state, how = f"checkpoint {kept} kept", "resume"
    elif is_done(run_dir):  # a relaunch goes on with the evaluations
        state, how = "training finished", "resume"
    else:
        state, how = "no checkpoint yet", "start it again"
    return f"interrupted during {stage_name} of {run_dir} ({reached}){lost}; {state}; run the same command to {how}"


def evaluation_interrupted_message(out_dir: str | Path, stage_name: str = START_UP) -> str:
    """The one line of a standalone evaluation: the part interrupted, the evaluations its folder keeps (the lines of
    eval/summary.jsonl, each committed whole), and how to go on: resume (those are read back, the rest evaluated),
    or start again when none is kept."""
    summary = summary_path(out_dir)
    try:
        done = [f"step {line['step']} {line['benchmark']}" for line in summary_lines(summary)]
    except (OSError, ValueError):  # a damaged file is named when the evaluation is relaunched
        done = []
    kept = f"kept in {summary}: {', '.join(done)}" if done else f"no evaluation kept yet in {summary}"
    how = "resume" if done else "start it again"
    return f"interrupted during {stage_name} of the evaluation into {out_dir}; {kept}; run the same command to {how}"
