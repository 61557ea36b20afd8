"""Which steps of a training run are evaluated, and where each one stands, from the run's files alone.

    <run_dir>/eval/adapters/step_<step:06d>/   the LoRA adapter of an evaluated step, kept until its
                                              evaluation is in summary.jsonl (or always: eval.keep_adapters)
    <run_dir>/eval/failures.jsonl              one line per failed evaluation attempt, with its traceback

A step is *done* when every benchmark has a line in eval/summary.jsonl; *failed* when its latest attempt
failed and it is not done; *pending* when its adapter waits for the evaluation stage. A run whose
scheduled steps are not all done is not finished, whatever its training did: `run_evaluation_state` is
what the entry points, the launcher and the results tables ask. Nothing here imports torch.
"""

from __future__ import annotations

import shutil
import time
import traceback as traceback_module
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.config_training import EvalConfig
from atr_grpo.evaluation.outputs import read_summary
from atr_grpo.rundir import layout, records


@dataclass(frozen=True)
class Schedule:
    """The one definition of which steps of a training run are evaluated: step 0 (when `at_start`), every
    `every_steps`, and the last step. The evaluation callback, the pipeline and the results tables all ask it."""

    every_steps: int
    at_start: bool

    @classmethod
    def of(cls, eval_section: dict[str, Any]) -> Schedule | None:
        """The schedule of a run's `eval` section (config.yaml as a dict); None when the run evaluates nothing. A
        key the file lacks takes the schema's default (`EvalConfig`), so an older file reads as it ran."""
        section = {**_SCHEMA_DEFAULTS, **eval_section}
        if not section["enabled"] or not section.get("every_steps"):
            return None
        return cls(int(section["every_steps"]), bool(section["at_start"]))

    def reached(self, step: int) -> bool:
        """Whether `step` is evaluated as soon as training reaches it (the last step is evaluated when training
        ends, wherever it falls)."""
        return self.at_start if step == 0 else step % self.every_steps == 0

    def steps(self, max_steps: int) -> list[int]:
        """Every evaluated step of a run of `max_steps` steps."""
        return sorted({step for step in range(max_steps + 1) if self.reached(step)} | {max_steps})


_SCHEMA_DEFAULTS = {name: getattr(EvalConfig, name) for name in ("enabled", "at_start")}  # never restated


def adapter_dir(run_dir: str | Path, step: int) -> Path:
    return layout.adapter_dir(run_dir, step)


def saved_adapters(run_dir: str | Path) -> dict[int, Path]:
    """The adapters waiting in eval/adapters/, by step (complete ones only: they carry their config file)."""
    folder = layout.adapters_dir(run_dir)
    if not folder.exists():
        return {}
    found = {}
    for path in folder.iterdir():
        step = layout.step_of(path.name)
        if step is not None and (path / "adapter_config.json").exists():
            found[step] = path
    return found


def remove_adapter(run_dir: str | Path, step: int) -> None:
    """Delete a step's saved adapter: ours to remove once its evaluation is recorded."""
    shutil.rmtree(adapter_dir(run_dir, step), ignore_errors=True)


def failures_path(run_dir: str | Path) -> Path:
    return layout.failures_path(run_dir)


def record_failure(run_dir: str | Path, step: int, stage: str, error: BaseException) -> dict[str, Any]:
    """Append one failed attempt (the exception and its traceback) to eval/failures.jsonl."""
    record = {
        "step": int(step),
        "stage": stage,  # "during" (in the training process) or "after" (the evaluation stage)
        "error": f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback_module.format_exception(type(error), error, error.__traceback__)),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    rundir.append_jsonl(failures_path(run_dir), record)
    return record


def read_failures(run_dir: str | Path) -> list[dict[str, Any]]:
    path = failures_path(run_dir)
    return rundir.read_jsonl(path) if path.exists() else []


@dataclass
class EvaluationState:
    """Where the scheduled evaluations of a run stand."""

    scheduled: list[int]
    done: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # step → the last error, for steps not done
    pending: list[int] = field(default_factory=list)  # not done, adapter saved: the evaluation stage's work
    missing: list[int] = field(default_factory=list)  # not done and no adapter to evaluate it from

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.scheduled)

    def describe(self) -> str:
        parts = [f"{len(self.done)} of {len(self.scheduled)} scheduled evaluations done"]
        if self.failed:
            parts.append(f"failed at steps {sorted(self.failed)}")
        if self.pending:
            parts.append(f"pending at steps {self.pending}")
        lost = [step for step in self.missing if step not in self.failed]
        if lost:
            parts.append(f"not evaluated and without an adapter at steps {lost}")
        return "; ".join(parts)


def evaluation_state(
    run_dir: str | Path, scheduled: list[int], benchmarks: list[str], trained_to: int | None = None
) -> EvaluationState:
    """The state of `scheduled` steps; steps after `trained_to` (training not that far yet) are not missing."""
    summary = read_summary(run_dir)
    done = [step for step in scheduled if all((step, name) in summary for name in benchmarks)]
    adapters = saved_adapters(run_dir)
    last_error: dict[int, str] = {}
    for record in read_failures(run_dir):
        last_error[int(record["step"])] = str(record["error"])
    state = EvaluationState(scheduled=scheduled, done=done)
    for step in scheduled:
        if step in done:
            continue
        if step in last_error:
            state.failed[step] = last_error[step]
        if step in adapters:
            state.pending.append(step)
        elif trained_to is None or step <= trained_to:
            state.missing.append(step)
    return state


def run_evaluation_state(run_dir: str | Path, config: dict[str, Any]) -> EvaluationState | None:
    """The evaluation state of a training run from its resolved config (config.yaml as a dict); None when
    the run evaluates nothing."""
    schedule = Schedule.of(config.get("eval") or {})
    if schedule is None:
        return None
    scheduled = schedule.steps(int(config["trainer"]["max_steps"]))
    done = records.read_done(run_dir)
    trained_to = done.step if done is not None else -1
    return evaluation_state(run_dir, scheduled, list(config["eval"]["benchmarks"]), trained_to)


def run_complete(run_dir: str | Path) -> bool:
    """Trained to its last step and every scheduled evaluation recorded: a run there is nothing left to do for."""
    run_dir = Path(run_dir)
    if not records.is_done(run_dir):
        return False
    state = run_evaluation_state(run_dir, rundir.load_config(layout.config_path(run_dir)))
    return state is None or state.complete
