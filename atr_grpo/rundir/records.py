"""The records a run directory holds, typed: what writers write, readers read and test fixtures build.

Each record turns into the dict its file holds (`to_dict`) and back (`from_dict`). Keys a record does not name
(a summary line's metrics, a sample's grader fields) ride along in `values`, in their order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atr_grpo.rundir import files, layout
from atr_grpo.rundir.errors import RunFileError


@dataclass(frozen=True)
class Done:
    """The DONE file: training reached its last step, in `seconds` of wall time."""

    step: int
    seconds: float | None = None
    backend: str | None = None
    rollout_engine: str | None = None
    world_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "seconds": self.seconds,
            "backend": self.backend,
            "rollout_engine": self.rollout_engine,
            "world_size": self.world_size,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Done:
        return cls(
            step=int(data["step"]),
            seconds=data.get("seconds"),
            backend=data.get("backend"),
            rollout_engine=data.get("rollout_engine"),
            world_size=data.get("world_size"),
        )


def read_done(run_dir: str | Path) -> Done | None:
    """The run's DONE record; None while training has not reached its last step."""
    path = layout.done_path(run_dir)
    return Done.from_dict(files.read_json(path)) if path.exists() else None


def write_done(run_dir: str | Path, done: Done) -> None:
    files.write_json(layout.done_path(run_dir), done.to_dict())


def is_done(run_dir: str | Path) -> bool:
    """Whether training reached its last step (the DONE file exists)."""
    return layout.done_path(run_dir).exists()


def _split(data: dict[str, Any], named: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in named}


@dataclass(frozen=True)
class SummaryRow:
    """One line of eval/summary.jsonl: the metrics of one (step, benchmark), written after its samples."""

    step: int
    benchmark: str
    values: dict[str, Any] = field(default_factory=dict)  # num_problems, n, mean@K, pass@K, time_s, metadata

    @property
    def key(self) -> tuple[int, str]:
        return self.step, self.benchmark

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "benchmark": self.benchmark, **self.values}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SummaryRow:
        return cls(int(data["step"]), str(data["benchmark"]), _split(data, ("step", "benchmark")))


@dataclass(frozen=True)
class SampleRecord:
    """One line of a per-sample file: one sample of one problem and its verdict."""

    problem_id: Any
    sample: int
    correct: bool
    values: dict[str, Any] = field(default_factory=dict)  # completion, extracted, gold, status, finish_reason, ...

    def to_dict(self) -> dict[str, Any]:
        return {"problem_id": self.problem_id, "sample": self.sample, "correct": self.correct, **self.values}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleRecord:
        named = ("problem_id", "sample", "correct")
        return cls(data["problem_id"], int(data["sample"]), bool(data["correct"]), _split(data, named))


@dataclass(frozen=True)
class MetricsLine:
    """One line of metrics.jsonl: what was logged at one training step."""

    step: int
    values: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, **self.values}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricsLine:
        return cls(int(data["step"]), _split(data, ("step",)))


# ---------------------------------------------------------------------------------------------- validating readers
STEPS_REMEDY = (
    "two processes wrote this run at once (before run directories were locked)? Its lines cannot be told apart: "
    "re-run it into a fresh run_dir"
)


def metrics_lines(path: str | Path, whole: bool = False) -> list[dict[str, Any]]:
    """The lines of a metrics.jsonl, refused (RunFileError naming the file and the steps) unless each has a step and
    the steps rise, each logged once: a run logs each optimizer step once, and a resume sets aside the lines after
    its checkpoint. [] when the file does not exist. `whole`: as `files.iter_jsonl`."""
    path = Path(path)
    if not path.exists():
        return []
    lines = files.read_jsonl(path, whole)
    steps = []
    for number, line in enumerate(lines, 1):
        if not isinstance(line.get("step"), int):
            raise RunFileError(f"{path}: record {number} has no integer step ({line.get('step')!r})")
        steps.append(line["step"])
    twice = _twice(steps)
    if twice:
        raise RunFileError(f"{path}: steps logged more than once: {_listed(twice)}; {STEPS_REMEDY}")
    back = [(before, after) for before, after in zip(steps, steps[1:], strict=False) if after < before]
    if back:
        listed = ", ".join(f"{after} after {before}" for before, after in back[:5])
        raise RunFileError(f"{path}: steps out of order: {listed}; {STEPS_REMEDY}")
    return lines


REPLACES = "replaces"  # a summary line's field: the per-sample file of the evaluation it replaces (a forced one)


def summary_lines(path: str | Path, whole: bool = False) -> list[dict[str, Any]]:
    """The lines of an eval/summary.jsonl, refused (RunFileError naming the file, steps and benchmarks) when a
    (step, benchmark) is recorded twice without the later line saying it `replaces` the earlier (a forced
    re-evaluation; readers take the last line): an evaluation is committed once, and a retried step is recorded
    later, so the steps need not rise. [] when the file does not exist. `whole`: as `files.iter_jsonl`."""
    path = Path(path)
    if not path.exists():
        return []
    lines = files.read_jsonl(path, whole)
    keys = []
    for number, line in enumerate(lines, 1):
        if not isinstance(line.get("step"), int) or not isinstance(line.get("benchmark"), str):
            raise RunFileError(f"{path}: record {number} has no integer step and benchmark name")
        if REPLACES not in line:
            keys.append((line["step"], line["benchmark"]))
    twice = _twice(keys)
    if twice:
        listed = _listed([f"{step} ({benchmark})" for step, benchmark in twice])
        raise RunFileError(f"{path}: evaluations recorded more than once: step {listed}; {STEPS_REMEDY}")
    return lines


def _twice(items: list[Any]) -> list[Any]:
    return sorted(item for item, times in Counter(items).items() if times > 1)


def _listed(items: list[Any], most: int = 10) -> str:
    shown = ", ".join(str(item) for item in items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")
