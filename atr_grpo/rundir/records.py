"""The records a run directory holds, typed: what writers write, readers read and test fixtures build.

Each record turns into the dict its file holds (`to_dict`) and back (`from_dict`). Keys a record does not name
(a summary line's metrics, a sample's grader fields) ride along in `values`, in their order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atr_grpo.rundir import files, layout


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
