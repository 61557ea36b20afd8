"""`python -m atr_grpo.launch [--dry-run] [--jobs N] [--runs DIR] PLAN [override ...]`: run an experiment's grid,
one fresh process per run.

PLAN is an experiment whose file (`conf/experiment/<PLAN>.yaml`) has a `plan:` key, which is data: `app` (train,
the default, or evaluate), an optional list of `runs` (override lists) and a `grid` (key → values, crossed with
every run); every run starts with `experiment=<PLAN>`. An entry of `runs` may instead be a mapping, `{overrides:
[...], grid: {seed: [0, 1, 2]}}`, whose grid narrows the plan's for that entry alone (a check run on some seeds):
each of its keys must be in the plan's grid, with values among the plan's. Hydra composes the rest of the file into
each run's config (the schema drops `plan`: atr_grpo.config_hydra.PLAN_KEY). Each run is a one-job Hydra multirun
(`python -m atr_grpo.train -m ...`), so its run directory is named from its overrides exactly as in a sweep.
Finished runs (trained, and every scheduled evaluation recorded) are skipped; interrupted ones, and trained ones
whose evaluations failed or wait, are launched again (a re-launch of the same config continues from its checkpoint,
or evaluates what is left), and a failed run does not stop the others. vLLM does not give GPU memory back, so every
run gets its own process.

`--runs DIR` puts every run directory in DIR (DIR/<run name>) instead of the experiment's own folder: the way to
re-run committed experiments from scratch without touching the committed runs. `--jobs N` runs N runs at once
(CPU plans whose runs use one thread each: `power` on 2 cores), each output line prefixed with its run's name.
The last line says how many runs were launched, how many were finished already and not re-run, and the wall time
the launched runs took.

With `hydra/launcher=slurm` among the overrides, each entry of `runs` becomes one multirun over the grid,
submitted as a SLURM job array through hydra-submitit-launcher.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from atr_grpo import rundir
from atr_grpo.evaluation.schedule import run_complete

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "conf" / "experiment"
APPS = ("train", "evaluate")
PLAN_FIELDS = ("app", "runs", "grid")


class PlanError(ValueError):
    pass


@dataclass
class Plan:
    name: str
    app: str
    common: list[str]
    runs: list[list[str]]
    grid: dict[str, list[str]]
    narrowed: list[dict[str, list[str]]] = field(default_factory=list)  # per entry of `runs`: its own grid values

    def grid_of(self, i: int) -> dict[str, list[str]]:
        """The grid that entry `i` of `runs` is crossed with: the plan's, with the entry's narrowed keys."""
        return {**self.grid, **(self.narrowed[i] if i < len(self.narrowed) else {})}

    def expand(self, extra: list[str] = ()) -> list[list[str]]:
        """The overrides of every run: common + run + one grid point + extra."""
        jobs = []
        for i, run in enumerate(self.runs):
            grid = self.grid_of(i)
            for point in itertools.product(*grid.values()):
                jobs.append([*self.common, *run, *(f"{k}={v}" for k, v in zip(grid, point)), *extra])
        return jobs

    def sweeps(self, extra: list[str] = ()) -> list[list[str]]:
        """One multirun per entry of `runs`, the grid as comma-separated sweeps (the SLURM form)."""
        return [
            [*self.common, *run, *(f"{k}={','.join(v)}" for k, v in self.grid_of(i).items()), *extra]
            for i, run in enumerate(self.runs)
        ]


def _read_plan(path: Path) -> dict | None:
    """The `plan:` of an experiment file as plain data (None when it has none); the rest of the file is Hydra's."""
    from atr_grpo.config_hydra import PLAN_KEY, register_configs

    register_configs()  # the package's resolvers (an exact ATR box: `${atr_kl3_eps_low:0.07}`) resolve in a plan too
    plan = OmegaConf.load(path).get(PLAN_KEY)
    return None if plan is None else OmegaConf.to_container(plan, resolve=True)


def available_plans() -> list[str]:
    """The experiments that have a plan."""
    return sorted(path.stem for path in EXPERIMENTS.glob("*.yaml") if _read_plan(path) is not None)


def load_plan(name: str) -> Plan:
    path = EXPERIMENTS / f"{name}.yaml"
    raw = _read_plan(path) if path.is_file() else None
    if raw is None:
        why = f": {path.relative_to(REPO)} has no plan: key" if path.is_file() else ""
        raise PlanError(f"unknown plan {name!r}{why}; the experiments with a plan: {', '.join(available_plans())}")
    if not isinstance(raw, dict) or set(raw) - set(PLAN_FIELDS):
        keys = sorted(set(raw) - set(PLAN_FIELDS)) if isinstance(raw, dict) else raw
        raise PlanError(f"{path}: unknown keys under plan: {keys}; allowed: {list(PLAN_FIELDS)}")
    app = raw.get("app", "train")
    if app not in APPS:
        raise PlanError(f"{path}: plan.app must be one of {', '.join(APPS)}, got {app!r}")
    grid = {str(k): [str(v) for v in values] for k, values in (raw.get("grid") or {}).items()}
    entries = [_run_entry(path, i, entry, grid) for i, entry in enumerate(raw.get("runs") or [[]])]
    runs, narrowed = [overrides for overrides, _ in entries], [own for _, own in entries]
    return Plan(name, app, [f"experiment={name}"], runs, grid, narrowed)


def _run_entry(path: Path, i: int, entry: object, grid: dict[str, list[str]]) -> tuple[list[str], dict]:
    """One entry of `runs`: its overrides, and the grid keys it narrows (see the module's docstring)."""
    if isinstance(entry, list):
        return [str(o) for o in entry], {}
    where = f"{path}: plan.runs[{i}]"
    if (
        not isinstance(entry, dict)
        or set(entry) - {"overrides", "grid"}
        or not isinstance(entry.get("overrides"), list)
    ):
        raise PlanError(
            f"{where} must be a list of overrides or a mapping with overrides: [...] and grid: {{...}}, got {entry!r}"
        )
    own = {str(k): [str(v) for v in values] for k, values in (entry.get("grid") or {}).items()}
    for key, values in own.items():
        if key not in grid:
            raise PlanError(
                f"{where}.grid.{key}: not a key of plan.grid ({', '.join(grid) or 'none'}); a run narrows the grid"
            )
        outside = [v for v in values if v not in grid[key]]
        if outside or not values:
            raise PlanError(f"{where}.grid.{key}: {outside or 'no values'}; allowed: among plan.grid.{key} {grid[key]}")
    return [str(o) for o in entry["overrides"]], own


def command(app: str, overrides: list[str], multirun: bool = True) -> list[str]:
    return [sys.executable, "-m", f"atr_grpo.{app}", *(["-m"] if multirun and app == "train" else []), *overrides]


def run_dir_of(overrides: list[str], runs_root: Path | None = None) -> Path:
    """Where `python -m atr_grpo.train -m <overrides>` writes (composed cheaply, nothing loaded); with `runs_root`,
    where it writes with `run_dir_override(runs_root)` among its overrides."""
    from atr_grpo.hydra_app import compose_train

    cfg = compose_train([o for o in overrides if not o.startswith("hydra")])
    if not any(o.split("=", 1)[0] in ("run_dir", "run_name") for o in overrides):
        cfg.run_name = rundir.sweep_run_name(cfg.run_name, overrides)  # what the multirun job's resolver gives
    if runs_root is not None:
        return runs_root / cfg.run_name
    return Path(cfg.run_dir)


def run_dir_override(runs_root: Path | None) -> str:
    """The override that puts a run's directory under `runs_root`, named as usual."""
    return f"run_dir={runs_root}/${{run_name}}"


@dataclass
class Tally:
    """What a launch did: runs launched (and which failed) and runs found finished, which were not re-run."""

    plan: str
    total: int
    launched: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    finished: list[Path] = field(default_factory=list)
    refused: bool = False  # the overrides did not compose: nothing ran
    jobs: int = 1  # runs at once
    seconds: float = 0.0  # wall time from the first launched run's start to the last one's end

    @property
    def exit_code(self) -> int:
        return 2 if self.refused else 1 if self.failed else 0

    def describe(self) -> str:
        ok = len(self.launched) - len(self.failed) + len(self.finished)
        line = (
            f"{self.plan}: {ok} of {self.total} runs ok; re-ran {len(self.launched)}"
            f"{f' ({len(self.failed)} failed)' if self.failed else ''}, "
            f"{len(self.finished)} already finished and not re-run"
        )
        if self.launched:
            took = f"{self.seconds / 60:.1f} min of wall time, {self.jobs} at once"
            line += f"; the {len(self.launched)} launched took {took}"
        if self.finished and not self.launched:
            line += (
                f"\nnothing was re-run: the {len(self.finished)} finished runs are used as they are; `--runs DIR` "
                "(make reproduce-<name> RERUN=1 OUT=DIR) re-runs them into a fresh folder"
            )
        return line


def _run_command(cmd: list[str], label: str | None) -> int:
    """Run one command from the repository root; with a `label`, its output lines are printed prefixed by it."""
    if label is None:
        return subprocess.run(cmd, cwd=REPO).returncode
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            print(f"[{label}] {line}", end="", flush=True)
    return proc.returncode


def run_plan(plan: Plan, extra: list[str], dry_run: bool, jobs: int = 1, runs_root: Path | None = None) -> Tally:
    """Launch the plan's runs (`jobs` at once), skipping finished ones; returns what was done."""
    slurm = any(o.startswith("hydra/launcher=") and not o.endswith("=basic") for o in extra)
    if runs_root is not None:  # absolute: the runs start in the repository root, wherever this is called from
        runs_root = runs_root.resolve()
        extra = [*extra, run_dir_override(runs_root)]
    jobs_overrides = plan.sweeps(extra) if slurm and plan.app == "train" else plan.expand(extra)
    tally = Tally(plan.name, len(jobs_overrides))
    from atr_grpo.errors import ConfigError
    from atr_grpo.hydra_app import check_sweep

    for overrides in jobs_overrides:  # every run's config is valid before the first one starts (a dry run's too)
        try:
            check_sweep(plan.app, overrides)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            tally.refused = True
            return tally
    if dry_run:
        for overrides in jobs_overrides:
            print(shlex.join(command(plan.app, overrides)))
        return tally

    pending: list[tuple[str, list[str]]] = []
    for i, overrides in enumerate(jobs_overrides, 1):
        label = f"{i}/{len(jobs_overrides)}"
        if plan.app == "train" and not slurm:
            try:
                target = run_dir_of([o for o in overrides if o != run_dir_override(runs_root)], runs_root)
                complete = run_complete(target)  # trained and every scheduled evaluation recorded
            except (ConfigError, rundir.RunFileError) as err:  # overrides that do not compose, a damaged run file
                print(f"error: {err}", file=sys.stderr)
                tally.refused = True
                return tally
            if complete:
                print(f"[{label}] finished already, skipped: {target}", flush=True)
                tally.finished.append(target)
                continue
            label = target.name
        pending.append((label, command(plan.app, overrides)))

    def start(job: tuple[str, list[str]]) -> None:
        label, cmd = job
        print(f"[{label}] {shlex.join(cmd)}", flush=True)
        tally.launched.append(shlex.join(cmd))
        if _run_command(cmd, label if jobs > 1 else None) != 0:
            tally.failed.append(shlex.join(cmd))

    tally.jobs, started = max(1, jobs), time.monotonic()
    with ThreadPoolExecutor(max_workers=tally.jobs) as pool:
        list(pool.map(start, pending))
    tally.seconds = time.monotonic() - started
    print(tally.describe())
    for cmd in tally.failed:
        print(f"failed: {cmd}", file=sys.stderr)
    return tally


def launch(plan: Plan, extra: list[str], dry_run: bool, jobs: int = 1, runs_root: Path | None = None) -> int:
    return run_plan(plan, extra, dry_run, jobs, runs_root).exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="print one command per run and run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1; CPU plans with 1 thread a run)")
    parser.add_argument(
        "--runs",
        type=Path,
        default=None,
        metavar="DIR",
        help="run directories go into DIR, not the experiment folder (a fresh re-run)",
    )
    parser.add_argument("plan", help="an experiment with a plan: key (conf/experiment/<PLAN>.yaml)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides appended to every run")
    opts = parser.parse_args(argv)
    try:
        plan = load_plan(opts.plan)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if opts.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {opts.jobs}")
    return launch(plan, list(opts.overrides), opts.dry_run, opts.jobs, opts.runs)


if __name__ == "__main__":
    sys.exit(main())
