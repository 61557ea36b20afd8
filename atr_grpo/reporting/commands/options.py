"""The options the results commands share (--runs, --experiment, --study and the statistics), their checks, and
the analysis plan they select."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from atr_grpo.reporting import plan, stats
from atr_grpo.reporting.analyses import planned, tables
from atr_grpo.reporting.methods import UnknownMethod, method_named
from atr_grpo.reporting.runs import Run
from atr_grpo.reporting.selection import DEFAULT_RUNS


def resample_count(text: str) -> int:
    value = int(text)
    if value < 100:
        raise argparse.ArgumentTypeError(f"must be >= 100, got {value}")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def level(text: str) -> float:
    value = float(text)
    if not 0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"must be in (0, 0.5), got {value}")
    return value


def add_run_options(parser: argparse.ArgumentParser, statistics: bool = True) -> None:
    """--runs, --experiment and --study; with `statistics`, the resampling, --alpha, --plan and --grader too."""
    parser.add_argument(
        "--runs",
        type=Path,
        default=DEFAULT_RUNS,
        help="where the run directories are (default: results/runs, else "
        "results/NAME/runs of the --study or --experiment NAME)",
    )
    parser.add_argument("--experiment", default=None, help="take the runs of this experiment only")
    parser.add_argument(
        "--study", default=None, help="take the runs of this study only (config `study`, else the experiment)"
    )
    if statistics:
        parser.add_argument(
            "--resamples",
            type=resample_count,
            default=10_000,
            help="bootstrap resamples and sign flips per interval / test (default 10,000)",
        )
        parser.add_argument("--bootstrap-seed", type=int, default=0, help="seed of every resampling (default 0)")
        parser.add_argument(
            "--alpha",
            type=level,
            default=tables.ALPHA,
            help="significance level; intervals are (1 − alpha) (default 0.05)",
        )
        parser.add_argument(
            "--plan",
            type=Path,
            default=None,
            help=f"the experiment's analysis plan (default: {plan.PLAN_FILE} beside --runs, when there is one)",
        )
        parser.add_argument(
            "--grader",
            default=None,
            metavar="TAG",
            help="use the verdicts of `regrade` with this tag (eval/regrade/TAG/) instead of the original ones",
        )


def resampling(opts: argparse.Namespace) -> stats.Resampling:
    return stats.Resampling(opts.resamples, opts.bootstrap_seed, 1.0 - opts.alpha)


def planned_analysis(
    opts: argparse.Namespace, runs: list[Run], resampling: stats.Resampling
) -> tuple[plan.Plan, plan.PlanCommit, list[planned.PlannedResult], list[str]] | None:
    """(the plan, its commit, its analysis, the runs flagged against it) when --plan or `plan.yaml` beside --runs
    names one whose experiment is among the runs; the flags also go to stderr, loudly. PlanError when the plan is
    broken, not committed, or its runs cannot answer it."""
    path = opts.plan or plan.default_path(opts.runs)
    if opts.plan is not None and not path.is_file():
        raise plan.PlanError(f"--plan {path}: no such file")
    if not path.is_file():
        return None
    the_plan = plan.load_plan(path)
    if opts.experiment not in (None, the_plan.experiment):
        return None
    if opts.alpha != the_plan.alpha:
        raise plan.PlanError(f"--alpha {opts.alpha:g} differs from the α of the plan {path} ({the_plan.alpha:g})")
    commit = plan.plan_commit(path)
    of_plan = [r for r in runs if r.config and r.experiment == the_plan.experiment]
    the_plan = with_method_names(the_plan, {r.method for r in of_plan})
    flagged = plan.runs_against_plan([r.path for r in of_plan], path, commit.commit)
    for line in flagged:
        print(f"WARNING: {path}: {line}", file=sys.stderr)
    if commit.uncommitted:
        print(
            f"WARNING: {path} has uncommitted changes: the tables follow its commit {commit.commit[:12]}",
            file=sys.stderr,
        )
    return the_plan, commit, planned.analyse(of_plan, the_plan, resampling), flagged


def with_method_names(the_plan: plan.Plan, names: set[str]) -> plan.Plan:
    """`the_plan` with each method it names spelled as the runs show it (a plan may give a name in its ASCII form,
    `methods.method_named`); a name no run has is kept as written, and the analysis refuses it, naming the methods."""

    def shown(name: str) -> str:
        try:
            return method_named(name, names)
        except UnknownMethod:
            return name

    def spelled(comparison: plan.Comparison) -> plan.Comparison:
        return plan.Comparison(shown(comparison.a), shown(comparison.b))

    secondary = tuple(map(spelled, the_plan.secondary))
    return dataclasses.replace(the_plan, primary=spelled(the_plan.primary), secondary=secondary)


def split(text: str | None) -> list[str] | None:
    """A comma-separated option as a list; None when it was not given."""
    return text.split(",") if text else None
