"""Run directories as the tables and figures see them: config, training metrics and evaluation summaries.

Everything here reads files only (contracts §3); nothing is recomputed from models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.evaluation.outputs import read_summary

AVERAGE = "average"


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # what is missing, in words (reported, never dropped)

    @property
    def experiment(self) -> str:
        return str(self.config.get("experiment", "?"))

    @property
    def model(self) -> str:
        return str(self.config.get("model", {}).get("name", "?"))

    @property
    def method(self) -> str:
        return str(self.config.get("method", self.config.get("clipping", {}).get("name", "?")))

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def clipping(self) -> dict[str, Any]:
        return dict(self.config.get("clipping", {}))

    @property
    def benchmarks(self) -> list[str]:
        return list(self.config.get("eval", {}).get("benchmarks", []))

    @property
    def k(self) -> int:
        return int(self.config.get("eval", {}).get("k", 8))

    @property
    def max_steps(self) -> int | None:
        value = self.config.get("trainer", {}).get("max_steps")
        return None if value is None else int(value)

    @cached_property
    def summary(self) -> dict[tuple[int, str], dict[str, Any]]:
        return read_summary(self.path)

    @cached_property
    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / rundir.METRICS_FILE
        return rundir.read_jsonl(path) if path.exists() else []

    def eval_table(self, metric: str) -> dict[int, dict[str, float]]:
        """{step: {benchmark: value, "average": mean over the configured benchmarks}} in percent.

        `average` is only defined at steps where every configured benchmark was evaluated (as in the paper).
        """
        table: dict[int, dict[str, float]] = {}
        for (step, bench), row in self.summary.items():
            if metric in row and row[metric] is not None:
                table.setdefault(step, {})[bench] = 100.0 * float(row[metric])
        for values in table.values():
            if self.benchmarks and all(b in values for b in self.benchmarks):
                values[AVERAGE] = sum(values[b] for b in self.benchmarks) / len(self.benchmarks)
        return dict(sorted(table.items()))


def load_run(path: Path) -> Run:
    config = OmegaConf.to_container(OmegaConf.load(path / rundir.CONFIG_FILE), resolve=False)
    run = Run(path=path, config=config)  # type: ignore[arg-type]
    if not run.summary:
        run.problems.append("no evaluation (eval/summary.jsonl missing or empty)")
        return run
    steps = sorted({step for step, _ in run.summary})
    for step in steps:
        missing = [b for b in run.benchmarks if (step, b) not in run.summary]
        if missing:
            run.problems.append(f"step {step}: no {', '.join(missing)}")
    if run.max_steps is not None and steps[-1] < run.max_steps:
        run.problems.append(f"last evaluation at step {steps[-1]} < trainer.max_steps = {run.max_steps}")
    return run


def find_runs(root: str | Path, experiment: str | None = None) -> list[Run]:
    """Every run directory under `root` (found by its config.yaml), optionally of one experiment."""
    runs = [load_run(p) for p in rundir.find_run_dirs(root)]
    return [r for r in runs if experiment is None or r.experiment == experiment]


def final_and_best(table: dict[int, dict[str, float]], key: str) -> tuple[float, float] | None:
    """(value at the last step that has `key`, max over steps), excluding step 0 (the start) when later
    steps exist: the paper's "final (best)"."""
    steps = [s for s in table if key in table[s]]
    if len(steps) > 1:
        steps = [s for s in steps if s > 0]
    if not steps:
        return None
    return table[steps[-1]][key], max(table[s][key] for s in steps)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1, as usual for "± std over seeds"); std is nan for one value."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
