"""`python -m atr_grpo.results compare A B`: method A − method B over the runs under --runs; with --eval, two
evaluation folders instead (`analyses/eval_compare.py`). The text is `render/compare_text.py`'s."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo.reporting import cells, plan, stats
from atr_grpo.reporting.analyses import compare, gates, parts, planned
from atr_grpo.reporting.commands import options
from atr_grpo.reporting.methods import UnknownMethod, method_named
from atr_grpo.reporting.render import compare_text, gates_text
from atr_grpo.reporting.runs import RunSet
from atr_grpo.reporting.selection import of_experiment, read_runs, start_points_agree


def main(argv: list[str]) -> int:
    if "--eval" in argv:
        return eval_main(argv)
    parser = argparse.ArgumentParser(prog="python -m atr_grpo.results compare", description=compare.__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "methods",
        nargs=2,
        metavar="METHOD",
        help="the two methods, A then B (A − B is shown), as shown or in their ASCII form (` · ` as `__`)",
    )
    options.add_run_options(parser)
    parser.add_argument("--benchmark", default=None, help="comma-separated benchmarks and/or `average` (default all)")
    parser.add_argument("--metric", default=None, help="comma-separated, e.g. mean@8,pass@8 (default mean@K,pass@K)")
    parser.add_argument("--step", type=int, default=None, help="compare at this step (default: each run's final)")
    parser.add_argument(
        "--endpoint",
        choices=cells.ENDPOINTS,
        default="final",
        help="each run's value: its final evaluation, or auc: the mean of its evaluations after step 0 (as the "
        "seeds_auc table)",
    )


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    runs = of_experiment(read_runs(parser, opts), opts.experiment)
    where = "" if opts.experiment is None else f" (among the runs of --experiment {opts.experiment!r})"
    try:  # a name as shown or in its ASCII form; from here on, as shown
        opts.methods = [method_named(m, {r.method for r in runs if r.config}, "METHOD") for m in opts.methods]
    except UnknownMethod as err:
        print(f"error: {err}{where}", file=sys.stderr)
        return 2
    if not start_points_agree([r for r in runs if r.method in opts.methods]):
        return 2
    resampling = options.resampling(opts)
    try:
        rows = compare.compare_methods(
            runs,
            *opts.methods,
            resampling,
            options.split(opts.benchmark),
            options.split(opts.metric),
            opts.step,
            opts.endpoint,
        )
        runs = RunSet(runs)  # compare_methods checked them for repeats: the parts and the plan need not again
        found = options.planned_analysis(opts, runs, resampling)
    except compare.CompareError as err:
        print(f"error: {err}{where}", file=sys.stderr)
        return 2
    except plan.PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if found is not None:
        the_plan, commit, analysis, _ = found
        planned.apply_to_rows(rows, *opts.methods, analysis, the_plan)
    for line in dict.fromkeys(w for row in rows for w in row.warnings):
        print(f"warning: {line}", file=sys.stderr)
    print(compare_text.format_rows(rows, *opts.methods, resampling), end="")
    print_parts(runs, rows, opts, resampling)
    if found is not None:
        print("\n".join(["", *planned.planned_lines(analysis, the_plan, commit.commit)]))
        print("\n".join(_gate_lines(runs, the_plan, analysis)), end="")
    return 0


def print_parts(runs: list, rows: list[compare.Row], opts: argparse.Namespace, resampling: stats.Resampling) -> None:
    """What the Mean@K difference is made of (`analyses/parts.py`); runs whose samples record no grader status
    get a note on stderr instead."""
    request = (options.split(opts.benchmark), options.split(opts.metric), opts.step, opts.endpoint)
    try:
        part_rows = parts.part_rows(runs, *opts.methods, resampling, *request)
        found = parts.splits(rows, runs, *opts.methods)
    except compare.CompareError as err:
        print(f"note: the parts of Mean@K are not shown: {err}", file=sys.stderr)
        return
    if part_rows or found:
        print("\n" + compare_text.format_parts(part_rows, found, *opts.methods, resampling), end="")


def _gate_lines(runs: list, the_plan: plan.Plan, analysis: list) -> list[str]:
    """The plan's design gates under its table (none when the plan has no gates)."""
    if the_plan.gates is None:
        return []
    return ["", *gates_text.gate_lines(gates.check(runs, the_plan, analysis), the_plan), ""]


def eval_main(argv: list[str]) -> int:
    """`compare --eval DIR_A DIR_B`; 2 with the reason on stderr when the comparison is refused."""
    from atr_grpo.reporting.analyses import eval_compare  # two evaluation folders

    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.results compare --eval",
        description=eval_compare.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--eval", nargs=2, type=Path, required=True, metavar=("DIR_A", "DIR_B"), dest="folders")
    parser.add_argument("--step-a", type=int, default=None, help="A's evaluation step (default: its last)")
    parser.add_argument("--step-b", type=int, default=None, help="B's evaluation step (default: its last)")
    parser.add_argument("--benchmark", default=None, help="comma-separated benchmarks (default: every one of A's)")
    parser.add_argument("--metric", default=None, help="comma-separated, e.g. mean@8,pass@8 (default mean@k,pass@k)")
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples and sign flips (>= 100)")
    parser.add_argument("--bootstrap-seed", type=int, default=0, help="seed of every resampling (default 0)")
    parser.add_argument("--alpha", type=float, default=0.05, help="intervals are (1 − alpha) (default 0.05)")
    opts = parser.parse_args(argv)
    try:
        resampling = stats.Resampling(opts.resamples, opts.bootstrap_seed, 1.0 - opts.alpha)
    except ValueError as err:
        parser.error(f"--resamples or --alpha: {err}")
    try:
        a = eval_compare.open_side("A", opts.folders[0], opts.step_a)
        b = eval_compare.open_side("B", opts.folders[1], opts.step_b)
        rows = eval_compare.compare_folders(a, b, resampling, options.split(opts.benchmark), options.split(opts.metric))
    except eval_compare.EvalCompareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in compare_text.setting_notes(a, b):
        print(line, file=sys.stderr)
    print(compare_text.format_eval_rows(a, b, rows, resampling), end="")
    return 0
