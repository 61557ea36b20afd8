"""`python -m atr_grpo.results {table2,table3,seeds,seeds_auc,delta,passk,clip_binding,endpoints,bounds,timing,all,
  figures} --runs DIR --out DIR`
`python -m atr_grpo.results compare A B --runs DIR [--benchmark B] [--metric mean@8] [--endpoint auc]`
`python -m atr_grpo.results compare --eval DIR_A DIR_B [--step-a N] [--step-b N]` (two models on the same problems)
`python -m atr_grpo.results regrade --runs DIR`
`python -m atr_grpo.results pack --runs DIR`
`python -m atr_grpo.results diverge RUN_A RUN_B` (where two runs expected to be the same part)

Reads only the run directories under --runs (found by their config.yaml) and writes the paper's tables as
CSV, Markdown and LaTeX, plus `<table>_vs_paper.md` where a row has a number the paper publishes
(results/paper/), or its figures as PNG and PDF. Each table takes the runs of one experiment:
  table2 → table2, table3 → table3, seeds and seeds_auc (each run's final value or AUC, IQM and the seed-level
  tests against clip) → table3, delta → ablate_delta (Figure 3), passk → passk_curve (Figure 4);
  binding (clip_binding: does the rule act or react to noise), endpoints (step 0, final, best, AUC per method) and
  bounds (per run: completion length, how often each bound fired) and timing (per run: wall, training and
  evaluation seconds) → every run; figures 2 and the clipping
  curves → table2. --experiment NAME takes that experiment's runs for every table and figure instead
  (`make tables EXPERIMENT=NAME`, `make figures EXPERIMENT=NAME`).
`all` builds every table whose runs exist and names the others. Runs with missing evaluations are listed
in the outputs and on stderr, never silently dropped; a line of a run file that is not JSON (a torn last line too)
stops the command with exit status 2, naming the file and the line. Only files this command wrote are ever
overwritten.
Runs are grouped by study (`study` in config.yaml, else the experiment; --study takes one) and model; a method is
named by the settings that differ within its study (`clip · trainer.learning_rate=0.001`). Two runs of one point
and seed (the same settings but where or how fast they ran) stop every table and `compare`, naming both. Identical
runs of two methods, and a rule that never acted, are named on stderr (and in `compare`'s output).
Tables 2 and 3 carry bootstrap intervals and seed-level tests against `clip` (--resamples, --alpha); --grader TAG
reads the verdicts of `regrade` instead of the original ones. `compare` prints method A − method B, the run
(seed) as the unit, with the same numbers as the tables; `regrade` re-scores every saved sample with the current
grader into eval/regrade/<tag>/;
`pack` compresses the per-sample files (`<bench>.jsonl` → `.jsonl.gz`, lossless, checked; readers take both).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo import provenance, rundir
from atr_grpo.evaluation.grader import DEFAULT_TIMEOUT
from atr_grpo.reporting import cells, pack, plan, regrade, stats
from atr_grpo.reporting.analyses import binding, compare, endpoints, planned, seeds, tables
from atr_grpo.reporting.analyses.no_effect import study_warnings
from atr_grpo.reporting.analyses.timing import timing_table
from atr_grpo.reporting.render import figures, writers
from atr_grpo.reporting.runs import RepeatedRuns, Run, find_runs, refuse_repeats

# each table's experiment; None = every run
TABLES = {
    "table2": "table2",
    "table3": "table3",
    "seeds": "table3",
    "seeds_auc": "table3",
    "delta": "ablate_delta",
    "passk": "passk_curve",
    "clip_binding": None,
    "endpoints": None,
    "bounds": None,
    "timing": None,
}
# the data of figures 3 and 4
FIGURE_TABLES = {"delta": tables.delta_table, "passk": tables.passk_table}
# tables of any experiment's training runs (reporting/analyses/endpoints.py, reporting/analyses/timing.py)
RUN_TABLES = {"endpoints": endpoints.endpoints_table, "bounds": endpoints.bounds_table, "timing": timing_table}
COMMANDS = (*TABLES, "all", "figures", "compare", "regrade", "pack", "diverge")
# tables whose rows are methods compared within one study (its Holm family): they take the runs of one study
STUDY_TABLES = ("table2", "table3", "seeds", "seeds_auc", "delta", "passk")


class ResultsError(RuntimeError):
    pass


def _select(runs: list[Run], runs_dir: Path, experiment: str | None) -> list[Run]:
    chosen = [run for run in runs if run.config and experiment in (None, run.experiment)]
    if chosen:
        return chosen
    found: dict[str, int] = {}
    for run in runs:
        found[run.experiment] = found.get(run.experiment, 0) + 1
    if not found:
        raise ResultsError(f"no run directories (folders with a config.yaml) under {runs_dir}")
    listing = ", ".join(f"{name} ({n} runs)" for name, n in sorted(found.items()))
    if experiment is None:
        raise ResultsError(f"no readable config.yaml under {runs_dir} (found: {listing})")
    raise ResultsError(
        f"no runs of experiment {experiment!r} under {runs_dir} (found: {listing}); --experiment NAME tabulates another"
    )


def build_table(
    name: str,
    runs: list[Run],
    runs_dir: Path,
    out_dir: Path,
    experiment: str | None = None,
    study: str | None = None,
    ddof: int = 0,
    resampling: stats.Resampling | None = None,
    alpha: float = tables.ALPHA,
) -> list[Path]:
    """Write one table from the runs of its experiment (every experiment, once --study chose the runs); raises
    ResultsError when there are none, or when a table of methods would mix studies."""
    chosen = _select(runs, runs_dir, experiment or (None if study else TABLES[name]))
    studies = sorted({run.study for run in chosen})
    if name in STUDY_TABLES and len(studies) > 1:
        raise ResultsError(
            f"the runs of experiment {experiment or TABLES[name]!r} belong to several studies ({', '.join(studies)}); "
            "--study NAME tabulates one"
        )
    if name == "table2":
        table = tables.table2(chosen, resampling, alpha)
    elif name == "table3":
        table = tables.table3(chosen, ddof=ddof, resampling=resampling, alpha=alpha)
    elif name in ("seeds", "seeds_auc"):
        table = seeds.seeds_table(chosen, resampling, alpha, endpoint="auc" if name == "seeds_auc" else "final")
    elif name == "clip_binding":
        table = binding.binding_table(chosen)
        if not table.rows:
            raise ResultsError("no run has clip/frac in its metrics.jsonl")
    elif name in RUN_TABLES:
        table = RUN_TABLES[name](chosen)
        if not table.rows:
            raise ResultsError("no training run with evaluations after step 0 and metrics.jsonl")
    else:
        table = FIGURE_TABLES[name](chosen)
    for line in table.missing:
        print(f"warning: {name}: {line}", file=sys.stderr)
    return writers.write_table(table, out_dir)


def _plan_table(opts: argparse.Namespace, runs: list[Run], out: Path) -> list[Path]:
    """`results all`: the `plan` table when the experiment has an analysis plan (a stale one is removed)."""
    found = _planned(opts, runs, _resampling(opts))
    if found is None:
        writers.remove_stale(out, "plan")
        return []
    return writers.write_table(tables.planned_table(found[2], found[0], found[1], found[3]), out)


def build_figures(
    runs: list[Run], runs_dir: Path, out_dir: Path, experiment: str | None = None, methods: list[str] | None = None
) -> tuple[list[Path], list[str]]:
    """Every figure whose data exist; returns (files written, figures skipped with the reason)."""
    written, skipped = figures.figure1(out_dir), []
    try:
        curves = refuse_repeats(_select(runs, runs_dir, experiment or "table2"))
        written += figures.figure2(curves, out_dir, methods=methods)
        written += figures.figure_clipping(curves, out_dir, methods=methods)
    except ResultsError as err:
        skipped.append(f"figure 2 and clipping curves: {err}")
        for stem in ("figure2_training_curves", "clipping_curves"):
            writers.remove_stale(out_dir, stem)
    try:
        chosen = _select(runs, runs_dir, experiment or TABLES["delta"])
        if not tables.delta_groups(chosen):
            raise ResultsError("the runs have no ATR δ values")
        written += figures.figure3(chosen, out_dir)
    except ResultsError as err:
        skipped.append(f"figure3_delta: {err}")
        writers.remove_stale(out_dir, "figure3_delta")
    try:
        table = tables.passk_table(_select(runs, runs_dir, experiment or TABLES["passk"]))
        if not table.rows:
            raise ResultsError("the runs have no per-sample files")
        written += figures.figure4(table, out_dir, methods)
    except ResultsError as err:
        skipped.append(f"figure4: {err}")
        writers.remove_stale(out_dir, "figure4_passk")
    return written, skipped


def _resample_count(text: str) -> int:
    value = int(text)
    if value < 100:
        raise argparse.ArgumentTypeError(f"must be >= 100, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def _level(text: str) -> float:
    value = float(text)
    if not 0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"must be in (0, 0.5), got {value}")
    return value


def _common(parser: argparse.ArgumentParser, statistics: bool = True) -> None:
    parser.add_argument("--runs", type=Path, default=Path("results/runs"), help="where the run directories are")
    parser.add_argument("--experiment", default=None, help="take the runs of this experiment only")
    parser.add_argument(
        "--study", default=None, help="take the runs of this study only (config `study`, else the experiment)"
    )
    if statistics:
        parser.add_argument(
            "--resamples",
            type=_resample_count,
            default=10_000,
            help="bootstrap resamples and sign flips per interval / test (default 10,000)",
        )
        parser.add_argument("--bootstrap-seed", type=int, default=0, help="seed of every resampling (default 0)")
        parser.add_argument(
            "--alpha",
            type=_level,
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


def _runs(parser: argparse.ArgumentParser, opts: argparse.Namespace) -> list[Run]:
    """The runs under --runs, read with --grader's verdicts; a bad --runs or --grader is a usage error."""
    if not opts.runs.is_dir():
        parser.error(f"--runs {opts.runs} is not a directory")
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
            parser.error(f"--study {opts.study!r}: no run of it under {opts.runs}; studies found: {', '.join(found)}")
    for run in runs:
        if not run.config:  # it cannot be placed in any table: say so here
            print(f"warning: {run.path}: {'; '.join(run.problems)}", file=sys.stderr)
    return runs


def _start_points_agree(runs: list[Run]) -> bool:
    """Runs paired in one table or comparison must share their starting point (env.json start_point): False, with
    the runs of each starting point named on stderr, when they do not; a note for runs that record none."""
    errors, notes = provenance.check_start_points([run for run in runs if run.config])
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return not errors


def _planned(
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
    flagged = plan.runs_against_plan([r.path for r in of_plan], path, commit.commit)
    for line in flagged:
        print(f"WARNING: {path}: {line}", file=sys.stderr)
    if commit.uncommitted:
        print(
            f"WARNING: {path} has uncommitted changes: the tables follow its commit {commit.commit[:12]}",
            file=sys.stderr,
        )
    return the_plan, commit, planned.analyse(of_plan, the_plan, resampling), flagged


def _resampling(opts: argparse.Namespace) -> stats.Resampling:
    return stats.Resampling(opts.resamples, opts.bootstrap_seed, 1.0 - opts.alpha)


def compare_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atr_grpo.results compare", description=compare.__doc__)
    parser.add_argument("methods", nargs=2, metavar="METHOD", help="the two methods, A then B (A − B is shown)")
    _common(parser)
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
    opts = parser.parse_args(argv)
    runs = [r for r in _runs(parser, opts) if opts.experiment in (None, r.experiment)]
    if not _start_points_agree([r for r in runs if r.method in opts.methods]):
        return 2
    resampling = _resampling(opts)
    split = lambda text: text.split(",") if text else None  # noqa: E731
    try:
        rows = compare.compare_methods(
            runs, *opts.methods, resampling, split(opts.benchmark), split(opts.metric), opts.step, opts.endpoint
        )
        found = _planned(opts, runs, resampling)
    except compare.CompareError as err:
        where = "" if opts.experiment is None else f" (among the runs of --experiment {opts.experiment!r})"
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
    print(compare.format_rows(rows, *opts.methods, resampling), end="")
    if found is not None:
        print("\n".join(["", *planned.planned_lines(analysis, the_plan, commit.commit)]))
    return 0


def regrade_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.results regrade",
        description=regrade.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser, statistics=False)
    parser.add_argument("--workers", type=int, default=None, help="grading processes (default: one per CPU)")
    parser.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT, help="seconds per answer (default 5)")
    parser.add_argument("--examples", type=int, default=3, help="changed verdicts shown per run and benchmark")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    opts = parser.parse_args(argv)
    runs = [r for r in _runs(parser, opts) if r.config and opts.experiment in (None, r.experiment)]
    if not runs:
        print(
            f"error: no run directories{'' if opts.experiment is None else ' of ' + opts.experiment} under {opts.runs}",
            file=sys.stderr,
        )
        return 2
    identity = regrade.grader_identity()
    versions = ", ".join(f"{name} {version}" for name, version in identity["packages"].items())
    print(f"grader {identity['tag']} ({versions}, grader code sha256 {identity['grader_code_sha256'][:12]})")
    total = changed = 0
    for run in runs:
        warn = lambda line: print(f"warning: {line}", file=sys.stderr)  # noqa: E731
        found = regrade.regrade_run(
            run.path,
            identity,
            opts.workers,
            opts.timeout,
            opts.examples,
            not opts.no_progress,
            warn,
            run.credit_inside_think,
        )
        for line in regrade.format_changes(found):
            print(line)
        total += sum(c.samples for c in found)
        changed += sum(c.changed for c in found)
    print(
        f"{changed} of {total} verdicts changed in {len(runs)} runs; summaries in "
        f"<run>/eval/regrade/{identity['tag']}/summary.jsonl (tables: --grader {identity['tag']})"
    )
    return 0


# what follows a damaged run file's name and line
DAMAGED_FILE_HINT = (
    "the results commands read every line of a run's files: repair or remove the damaged line (a torn last line is "
    "a record whose write was cut off), or move the run out of --runs"
)


def main(argv: list[str] | None = None) -> int:
    """Run one command; a damaged run file stops it with the file and line named (exit status 2)."""
    try:
        return _command(sys.argv[1:] if argv is None else list(argv))
    except rundir.RunFileError as err:
        print(f"error: {err}\n{DAMAGED_FILE_HINT}", file=sys.stderr)
        return 2
    except RepeatedRuns as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _command(argv: list[str]) -> int:
    if argv and argv[0] == "diverge":
        from atr_grpo.reporting.analyses import divergence

        return divergence.main(argv[1:])
    if argv and argv[0] == "pack":
        return pack.main(argv[1:])
    if argv and argv[0] == "compare" and "--eval" in argv[1:]:
        from atr_grpo.reporting.analyses import (
            eval_compare,  # two evaluation folders (reporting/analyses/eval_compare.py)
        )

        return eval_compare.main(argv[1:])
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    if argv and argv[0] == "regrade":
        return regrade_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.results", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", help=f"one of {', '.join(COMMANDS)}")
    _common(parser)
    parser.add_argument("--out", type=Path, default=None, help="output folder (results/tables or results/figures)")
    parser.add_argument(
        "--ddof",
        type=int,
        choices=(0, 1),
        default=0,
        help="table3's std over seeds: 0 as in the paper (default), 1 for the sample std",
    )
    parser.add_argument(
        "--methods", default=None, help="figures 2, 4 and the clipping curves: comma-separated methods (default all)"
    )
    opts = parser.parse_args(argv)
    if opts.what not in COMMANDS:
        parser.error(f"unknown table {opts.what!r}; allowed: {', '.join(COMMANDS)}")
    out = opts.out or Path("results/figures" if opts.what == "figures" else "results/tables")
    runs = _runs(parser, opts)
    if opts.what != "figures" and not _start_points_agree([r for r in runs if opts.experiment in (None, r.experiment)]):
        return 2
    refuse_repeats([r for r in runs if opts.experiment in (None, r.experiment)])
    options = {"study": opts.study, "ddof": opts.ddof, "resampling": _resampling(opts), "alpha": opts.alpha}
    written: list[Path] = []
    try:
        if opts.what == "figures":
            methods = opts.methods.split(",") if opts.methods else None
            written, skipped = build_figures(runs, opts.runs, out, opts.experiment, methods)
            for reason in skipped:
                print(f"skipped {reason}", file=sys.stderr)
        elif opts.what != "all":
            written = build_table(opts.what, runs, opts.runs, out, opts.experiment, **options)
        else:
            for name in TABLES:
                try:
                    written += build_table(name, runs, opts.runs, out, opts.experiment, **options)
                except ResultsError as err:
                    print(f"skipped {name}: {err}", file=sys.stderr)
                    writers.remove_stale(out, name)
            if not written:
                raise ResultsError(f"none of {', '.join(TABLES)} has runs under {opts.runs}")
            written += _plan_table(opts, runs, out)
    except (ResultsError, writers.OutputError, plan.PlanError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if opts.what != "figures":
        for line in study_warnings([r for r in runs if opts.experiment in (None, r.experiment)]):
            print(f"warning: {line}", file=sys.stderr)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
