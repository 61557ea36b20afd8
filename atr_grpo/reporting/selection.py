"""Which runs a results command reads: those under --runs, with --grader's verdicts, of --study and --experiment,
checked once for what would make a table or comparison wrong (repeated points, different start points)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo import provenance, rundir
from atr_grpo.errors import did_you_mean
from atr_grpo.reporting import regrade
from atr_grpo.reporting.runs import Run, RunSet, find_runs


class ResultsError(RuntimeError):
    """A table or figure that has no runs to be built from."""


def read_runs(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> list[Run]:
    """The runs under --runs, read with --grader's verdicts; a bad --runs or --grader is a usage error."""
    if not opts.runs.is_dir():
        opts.runs = _own_folder(parser, opts)
    grader = getattr(opts, "grader", None)
    if grader is not None:
        found = sorted({tag for path in rundir.find_run_dirs(opts.runs) for tag in regrade.tags(path)})
        if grader not in found:
            parser.error(
                f"--grader {grader!r}: no run under {opts.runs} has eval/regrade/{grader}/; regrades found: "
                f"{', '.join(found) or 'none (python -m atr_grpo.results regrade writes them)'}"
            )
    runs = find_runs(opts.runs, grader=grader)
    if opts.study is not None:
        found = sorted({run.study for run in runs if run.config})
        runs = [run for run in runs if run.study == opts.study]
        if not runs:
            guess = did_you_mean(opts.study, found)
            parser.error(
                f"--study {opts.study!r}: no run of it under {opts.runs}{guess} studies found: {', '.join(found)}"
            )
    for run in runs:
        if not run.config:  # it cannot be placed in any table: say so here
            print(f"warning: {run.path}: {'; '.join(run.problems)}", file=sys.stderr)
    return runs


DEFAULT_RUNS = Path("results/runs")


def _own_folder(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> Path:
    """With --runs left at its default and absent, the folder of the --study or --experiment named, where
    `reproduce` writes it (results/NAME/runs), said on stderr; else a usage error that lists the run folders here."""
    name = opts.study or opts.experiment
    own = Path("results") / name / "runs" if name else None
    if opts.runs == DEFAULT_RUNS and own is not None and own.is_dir():
        print(f"reading {own}: the runs of {name} (--runs {DEFAULT_RUNS} is absent)", file=sys.stderr)
        return own
    found = sorted(str(p) for p in Path("results").glob("*/runs") if p.is_dir())
    listed = f"; run folders here: {', '.join(found)}" if found else ""
    parser.error(f"--runs {opts.runs} is not a directory{listed}")


def of_experiment(runs: list[Run], experiment: str | None) -> list[Run]:
    """The runs of `experiment`, or all of them when it is None (--experiment not given); a RunSet of a RunSet."""
    chosen = [run for run in runs if experiment in (None, run.experiment)]
    return RunSet(chosen) if isinstance(runs, RunSet) else chosen


def checked_runs(runs: list[Run], experiment: str | None) -> list[Run]:
    """What a command reads, checked for repeats once: the runs of `experiment` (all runs when None) as a RunSet,
    which the analyses take without checking again; `runs` as given when the experiment has none (`select` then
    names what was found)."""
    mine = of_experiment(runs, experiment)
    return RunSet.checked(mine) if mine else runs


def select(runs: list[Run], runs_dir: Path, experiment: str | None) -> list[Run]:
    """The readable runs of `experiment` (every experiment when None), a RunSet of a RunSet; ResultsError naming
    what was found when there are none."""
    chosen = of_experiment([run for run in runs if run.config], experiment)
    chosen = RunSet(chosen) if isinstance(runs, RunSet) else chosen
    if chosen:
        return chosen
    found: dict[str, int] = {}
    for run in runs:
        found[run.experiment] = found.get(run.experiment, 0) + 1
    if not found:
        raise ResultsError(f"no run directories (folders with a {rundir.CONFIG_FILE}) under {runs_dir}")
    listing = ", ".join(f"{name} ({n} runs)" for name, n in sorted(found.items()))
    if experiment is None:
        raise ResultsError(f"no readable {rundir.CONFIG_FILE} under {runs_dir} (found: {listing})")
    raise ResultsError(
        f"no runs of experiment {experiment!r} under {runs_dir} (found: {listing}); --experiment NAME tabulates another"
    )


def start_points_agree(runs: list[Run]) -> bool:
    """Runs paired in one table or comparison must share their starting point (env.json start_point): False, with
    the runs of each starting point named on stderr, when they do not; a note for runs that record none."""
    errors, notes = provenance.check_start_points([run for run in runs if run.config])
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return not errors
