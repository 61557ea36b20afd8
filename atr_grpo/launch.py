"""`python -m atr_grpo.launch [--dry-run] PLAN [override ...]`: run an experiment's grid, one fresh process per run.

A plan (`conf/plan/<PLAN>.yaml`) is data: `app` (train or evaluate), `common` overrides, an optional list of
`runs` (override lists) and a `grid` (key → values, crossed with every run). Each run is a one-job Hydra
multirun (`python -m atr_grpo.train -m ...`), so its run directory is named from its overrides exactly as in a
sweep. Finished runs (trained, and every scheduled evaluation recorded) are skipped; interrupted ones, and
trained ones whose evaluations failed or wait, are launched again (a re-launch of the same config continues
from its checkpoint, or evaluates what is left), and a failed run does not stop the others. vLLM does not
give GPU memory back, so every run gets its own process.

With `hydra/launcher=slurm` among the overrides, each entry of `runs` becomes one multirun over the grid,
submitted as a SLURM job array through hydra-submitit-launcher.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.evaluation.schedule import run_complete

REPO = Path(__file__).resolve().parent.parent
PLANS = REPO / "conf" / "plan"
APPS = ("train", "evaluate")


class PlanError(ValueError):
    pass


@dataclass
class Plan:
    name: str
    app: str
    common: list[str]
    runs: list[list[str]]
    grid: dict[str, list[str]]

    def expand(self, extra: list[str] = ()) -> list[list[str]]:
        """The overrides of every run: common + run + one grid point + extra."""
        keys = list(self.grid)
        points = list(itertools.product(*(self.grid[k] for k in keys))) or [()]
        return [
            [*self.common, *run, *(f"{k}={v}" for k, v in zip(keys, point)), *extra]
            for run in self.runs
            for point in points
        ]

    def sweeps(self, extra: list[str] = ()) -> list[list[str]]:
        """One multirun per entry of `runs`, the grid as comma-separated sweeps (the SLURM form)."""
        grid = [f"{k}={','.join(v)}" for k, v in self.grid.items()]
        return [[*self.common, *run, *grid, *extra] for run in self.runs]


def available_plans() -> list[str]:
    return sorted(p.stem for p in PLANS.glob("*.yaml"))


def load_plan(name: str) -> Plan:
    path = PLANS / f"{name}.yaml"
    if not path.exists():
        raise PlanError(f"unknown plan {name!r}; allowed: {', '.join(available_plans())}")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    allowed = {"app", "common", "runs", "grid"}
    if set(raw) - allowed:
        raise PlanError(f"{path}: unknown keys {sorted(set(raw) - allowed)}; allowed: {sorted(allowed)}")
    app = raw.get("app", "train")
    if app not in APPS:
        raise PlanError(f"{path}: app must be one of {', '.join(APPS)}, got {app!r}")
    grid = {str(k): [str(v) for v in values] for k, values in (raw.get("grid") or {}).items()}
    runs = [[str(o) for o in run] for run in (raw.get("runs") or [[]])]
    return Plan(name, app, [str(o) for o in raw.get("common") or []], runs, grid)


def command(app: str, overrides: list[str], multirun: bool = True) -> list[str]:
    return [sys.executable, "-m", f"atr_grpo.{app}", *(["-m"] if multirun and app == "train" else []), *overrides]


def run_dir_of(overrides: list[str]) -> Path:
    """Where `python -m atr_grpo.train -m <overrides>` writes (composed cheaply, nothing loaded)."""
    from atr_grpo.hydra_app import compose_train

    cfg = compose_train([o for o in overrides if not o.startswith("hydra")])
    if not any(o.split("=", 1)[0] in ("run_dir", "run_name") for o in overrides):
        cfg.run_name = rundir.sweep_run_name(cfg.run_name, overrides)  # what the multirun job's resolver gives
    return Path(cfg.run_dir)


def launch(plan: Plan, extra: list[str], dry_run: bool) -> int:
    slurm = any(o.startswith("hydra/launcher=") and not o.endswith("=basic") for o in extra)
    jobs = plan.sweeps(extra) if slurm and plan.app == "train" else plan.expand(extra)
    from atr_grpo.config import ConfigError
    from atr_grpo.hydra_app import check_sweep

    for overrides in jobs:  # every run's config is valid before the first one starts (a dry run's too)
        try:
            check_sweep(plan.app, overrides)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if dry_run:
        for overrides in jobs:
            print(shlex.join(command(plan.app, overrides)))
        return 0

    done, failed = [], []
    for i, overrides in enumerate(jobs, 1):
        if plan.app == "train" and not slurm:
            try:
                target = run_dir_of(overrides)
            except ConfigError as err:  # overrides that do not compose: nothing can run
                print(f"error: {err}", file=sys.stderr)
                return 2
            if run_complete(target):  # trained and every scheduled evaluation recorded
                print(f"[{i}/{len(jobs)}] finished already, skipped: {target}", flush=True)
                done.append(target)
                continue
        cmd = command(plan.app, overrides)
        print(f"[{i}/{len(jobs)}] {shlex.join(cmd)}", flush=True)
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            failed.append(shlex.join(cmd))
    print(f"{plan.name}: {len(jobs) - len(failed)} of {len(jobs)} runs ok ({len(done)} already finished)")
    for cmd in failed:
        print(f"failed: {cmd}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="print one command per run and run nothing")
    parser.add_argument("plan", help="conf/plan/<PLAN>.yaml")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides appended to every run")
    opts = parser.parse_args(argv)
    try:
        plan = load_plan(opts.plan)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return launch(plan, list(opts.overrides), opts.dry_run)


if __name__ == "__main__":
    sys.exit(main())
