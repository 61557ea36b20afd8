"""The end of a Hydra multirun (`python -m atr_grpo.train -m ...`): a table of its jobs, and its config kept.

`SweepSummary` is a Hydra callback (registered in conf/train.yaml). Each job the sweep ran in this process (Hydra's
basic launcher) is a row: its number, its run directory and its status, printed once the sweep ends, so that a
sweep's outcome is read in one place rather than scrolled for. A launcher whose jobs run elsewhere (SLURM) reports
them there. Hydra writes the sweep's config to `<sweep dir>/multirun.yaml` (the folder above run_dir,
conf/train.yaml), which the next sweep into the same folder overwrites: each sweep's is also kept under a name of its
own (`layout.sweep_config_copy`); the table ends with that folder. A Ctrl-C ends the sweep with the table too
(`interrupted`): the jobs done, the one interrupted, and those not started.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from atr_grpo.rundir import layout


class SweepSummary(Callback):
    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []  # (run directory, status), in the order the jobs ended
        self.jobs: list[list[str]] = []  # every job's overrides, in the sweep's order
        self.running = ""  # the run directory of the job running now

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from atr_grpo.hydra_app import sweep_jobs

        global _sweep
        _sweep = self
        self.jobs = sweep_jobs(OmegaConf.to_container(config.hydra.overrides.task))  # as typed, unresolved

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.running = str(OmegaConf.select(config, "run_dir", default=""))

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        run_dir = str(OmegaConf.select(job_return.cfg, "run_dir", default=job_return.working_dir))
        self.rows.append((run_dir, job_status(run_dir, job_return)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        written = sweep_dir / layout.SWEEP_CONFIG_FILE
        if written.exists():
            shutil.copyfile(written, layout.sweep_config_copy(sweep_dir, time.strftime("%Y%m%d-%H%M%S")))
        if self.rows:
            print(sweep_table(self.rows))
            print(f"{layout.SWEEP_CONFIG_FILE} kept in {sweep_dir}")
        self.rows = []
        global _sweep
        _sweep = None


_sweep: SweepSummary | None = None  # the sweep running in this process, for `interrupted`


def interrupted() -> None:
    """After a Ctrl-C's line in a sweep's job: the table of the jobs done, the one interrupted and those not
    started (each by its overrides). Nothing outside a sweep."""
    global _sweep
    if _sweep is None or not _sweep.running:
        return
    done, jobs = len(_sweep.rows), _sweep.jobs
    shared = set.intersection(*map(set, jobs)) if jobs else set()  # what every job sets alike: not shown
    waiting = [(" ".join(o for o in job if o not in shared), "not started") for job in jobs[done + 1 :]]
    print(sweep_table([*_sweep.rows, (_sweep.running, "interrupted"), *waiting]), file=sys.stderr)
    _sweep = None


def job_status(run_dir: str, job_return: JobReturn) -> str:
    """`finished`, the run's NOT COMPLETE line, or `failed: <error>`."""
    if job_return.status != JobStatus.COMPLETED:
        error = job_return._return_value  # the exception the job raised (reading `return_value` re-raises it)
        return f"failed: {type(error).__name__}: {error}"
    from atr_grpo.training.pipeline import run_outcome

    if not (Path(run_dir) / layout.CONFIG_FILE).exists():
        return "not started"
    outcome = run_outcome(Path(run_dir))
    return "finished" if outcome.ok else "not complete: " + outcome.summary().split(": ", 2)[-1]


def sweep_table(rows: list[tuple[str, str]]) -> str:
    """`job  run dir  status` with a line per job, the columns aligned."""
    table = [("job", "run dir", "status"), *((str(n), run_dir, status) for n, (run_dir, status) in enumerate(rows, 1))]
    widths = [max(len(row[column]) for row in table) for column in range(2)]
    lines = [f"{job:>{widths[0]}}  {run_dir:<{widths[1]}}  {status}" for job, run_dir, status in table]
    return f"sweep of {len(rows)} job{'s' if len(rows) > 1 else ''}:\n" + "\n".join(lines)
