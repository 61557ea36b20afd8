"""`python -m atr_grpo.results {table2,table3,seeds,seeds_auc,delta,passk,clip_binding,endpoints,parts,bounds,timing,
  all,figures} --runs DIR --out DIR`
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
  binding (clip_binding: does the rule act or react to noise), endpoints (step 0, final, best, AUC per method),
  parts (the same of Mean@K's answered rate, accuracy given an answer and truncated share, from the samples) and
  bounds (per run: completion length, how often each bound fired) and timing (per run: wall, training and
  evaluation seconds) → every run; figures 2 and the clipping
  curves → table2. --experiment NAME takes that experiment's runs for every table and figure instead
  (`make tables EXPERIMENT=NAME`, `make figures EXPERIMENT=NAME`).
`all` builds every table whose runs exist and names the others; a table of methods (table2, table3, seeds,
seeds_auc, delta, passk) whose runs belong to several studies is built once per study, into --out/<study>/ (one
study, or --study, writes into --out itself). Runs with missing evaluations are listed
in the outputs and on stderr, never silently dropped; a line of a run file that is not JSON (a torn last line too)
stops the command with exit status 2, naming the file and the line. Only files this command wrote are ever
overwritten, and only once the whole build is written (a killed build leaves --out as it was).
Runs are grouped by study (`study` in config.yaml, else the experiment; --study takes one) and model; a method is
named by its rule and the settings its launch changed (`clip · trainer.learning_rate=0.001`). Two runs of one point
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

from atr_grpo.errors import did_you_mean
from atr_grpo.reporting import plan, stats
from atr_grpo.reporting.analyses import binding, endpoints, gates, seeds, tables
from atr_grpo.reporting.analyses.no_effect import study_warnings
from atr_grpo.reporting.analyses.timing import timing_table
from atr_grpo.reporting.commands import options
from atr_grpo.reporting.render import gates_text, writers
from atr_grpo.reporting.runs import Run, RunSet
from atr_grpo.reporting.selection import (
    ResultsError,
    checked_runs,
    of_experiment,
    read_runs,
    select,
    start_points_agree,
)
from atr_grpo.rundir import layout

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
    "parts": None,
    "bounds": None,
    "timing": None,
}
# the data of figures 3 and 4
FIGURE_TABLES = {"delta": tables.delta_table, "passk": tables.passk_table}
# tables of any experiment's training runs (reporting/analyses/endpoints.py, reporting/analyses/timing.py)
RUN_TABLES = {
    "endpoints": endpoints.endpoints_table,
    "parts": endpoints.parts_table,
    "bounds": endpoints.bounds_table,
    "timing": timing_table,
}


def experiment_of(name: str, experiment: str | None, study: str | None) -> str | None:
    """The experiment whose runs table or figure `name` takes: --experiment, else every experiment once --study
    chose the runs, else the table's own (`TABLES`)."""
    return experiment or (None if study else TABLES[name])


COMMANDS = (*TABLES, "all", "figures", "compare", "regrade", "pack", "diverge")
# tables whose rows are methods compared within one study (its Holm family): they take the runs of one study
STUDY_TABLES = ("table2", "table3", "seeds", "seeds_auc", "delta", "passk")


def main(argv: list[str]) -> int:
    parser = make_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        parser.error(unknown_command(argv[0]))  # before parsing: its other words would be "unrecognized arguments"
    return run(parser.parse_args(argv), parser)


def unknown_command(typed: str) -> str:
    """`unknown subcommand 'comapre'; did you mean 'compare'? allowed: table2, ...` (a guess only when one is
    close)."""
    return f"unknown subcommand {typed!r}{did_you_mean(typed, COMMANDS)} allowed: {', '.join(COMMANDS)}"


def make_parser() -> argparse.ArgumentParser:
    """The parser of the tables and of `figures`: they share their options."""
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.results", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", help=f"one of {', '.join(COMMANDS)}")
    options.add_run_options(parser)
    parser.add_argument("--out", type=Path, default=None, help="output folder (results/tables or results/figures)")
    parser.add_argument(
        "--ddof",
        type=int,
        choices=(0, 1),
        default=1,
        help="table3's std over seeds: 1, the sample std (default, as every SD of the results), 0 as in the paper",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help="figures 2, 4 and the clipping curves: comma-separated methods, as shown or in their ASCII form "
        "(` · ` as `__`; default all)",
    )


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if opts.what not in COMMANDS:
        parser.error(unknown_command(opts.what))
    out = opts.out or Path("results/tables")
    runs = read_runs(parser, opts)
    if not start_points_agree(of_experiment(runs, opts.experiment)):
        return 2
    runs = checked_runs(runs, opts.experiment)
    try:
        with writers.staged(out) as stage:
            written = [out / path.relative_to(stage) for path in _build_tables(opts, runs, stage)]
        if not written:  # `all` with no table to build: the earlier tables, now stale, were removed
            raise ResultsError(f"none of {', '.join(TABLES)} has runs under {opts.runs}")
    except (ResultsError, writers.OutputError, plan.PlanError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in study_warnings(of_experiment(runs, opts.experiment)):
        print(f"warning: {line}", file=sys.stderr)
    for path in written:
        print(path)
    return 0


def _build_tables(opts: argparse.Namespace, runs: list[Run], out: Path) -> list[Path]:
    """One table, or with `all` every table whose runs exist (the others named on stderr, their earlier files
    removed) and the plan's; `all` with none: []."""
    settings = {"study": opts.study, "ddof": opts.ddof, "resampling": options.resampling(opts), "alpha": opts.alpha}
    if opts.what != "all":
        return build_table(opts.what, runs, opts.runs, out, opts.experiment, **settings)
    written: list[Path] = []
    for name in TABLES:
        try:
            studies = _studies_apart(name, runs, opts)
            if not studies:
                written += build_table(name, runs, opts.runs, out, opts.experiment, **settings)
                continue
        except ResultsError as err:
            print(f"skipped {name}: {err}", file=sys.stderr)
            writers.remove_stale(out, name)
            continue
        writers.remove_stale(out, name)  # one per study now: an earlier table of them all is stale
        for study in studies:
            mine = [run for run in runs if run.study == study]
            try:
                written += build_table(
                    name,
                    RunSet(mine) if isinstance(runs, RunSet) else mine,
                    opts.runs,
                    out,
                    opts.experiment,
                    folder=study,
                    **settings,
                )
            except ResultsError as err:
                print(f"skipped {name} of study {study}: {err}", file=sys.stderr)
    return written + _plan_table(opts, runs, out) if written else []


def _studies_apart(name: str, runs: list[Run], opts: argparse.Namespace) -> list[str]:
    """The studies `all` tabulates one by one, each into OUT/<study>/: those of a table of methods whose runs
    belong to several studies (none with --study, or when the runs form one study, whose files stay in OUT)."""
    if name not in STUDY_TABLES or opts.study is not None:
        return []
    studies = sorted({run.study for run in select(runs, opts.runs, experiment_of(name, opts.experiment, None))})
    unsafe = [study for study in studies if "/" in study or study.startswith(".")]
    if len(studies) > 1 and unsafe:
        raise ResultsError(f"study {unsafe[0]!r} cannot name a folder of --out; --study NAME tabulates one study")
    return studies if len(studies) > 1 else []


def build_table(
    name: str,
    runs: list[Run],
    runs_dir: Path,
    out_dir: Path,
    experiment: str | None = None,
    study: str | None = None,
    ddof: int = 1,
    resampling: stats.Resampling | None = None,
    alpha: float = tables.ALPHA,
    folder: str = "",
) -> list[Path]:
    """Write one table from the runs of its experiment (every experiment, once --study chose the runs), into
    `folder` of `out_dir` when one is named; raises ResultsError when there are none, or when a table of methods
    would mix studies."""
    chosen = select(runs, runs_dir, experiment_of(name, experiment, study))
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
            raise ResultsError(f"no run has clip/frac in its {layout.METRICS_FILE}")
    elif name in RUN_TABLES:
        table = RUN_TABLES[name](chosen)
        if not table.rows:
            raise ResultsError(f"no training run with evaluations after step 0 and {layout.METRICS_FILE}")
    else:
        reason = tables.one_delta_reason(tables.delta_groups(chosen)) if name == "delta" else None
        if reason is not None:
            raise ResultsError(reason)
        table = FIGURE_TABLES[name](chosen)
    for line in table.missing:
        print(f"warning: {name}: {line}", file=sys.stderr)
    return writers.write_table(table, out_dir, folder)


def _plan_table(opts: argparse.Namespace, runs: list[Run], out: Path) -> list[Path]:
    """`results all`: the `plan` table when the experiment has an analysis plan (a stale one is removed)."""
    found = options.planned_analysis(opts, runs, options.resampling(opts))
    if found is None:
        writers.remove_stale(out, "plan")
        writers.remove_stale(out, "gates")
        return []
    written = writers.write_table(tables.planned_table(found[2], found[0], found[1], found[3]), out)
    return written + _gates_table(runs, found[0], found[2], out)


def _gates_table(runs: list[Run], the_plan: plan.Plan, analysis: list, out: Path) -> list[Path]:
    """`results all`: the `gates` table when the plan (or an amendment) has gates; the verdicts go to stderr too."""
    if the_plan.gates is None:
        writers.remove_stale(out, "gates")
        return []
    result = gates.check(runs, the_plan, analysis)
    for line in [*(a.describe() for a in the_plan.amendments), *gates_text.verdict_lines(result)]:
        print(line, file=sys.stderr)
    return writers.write_table(gates.gates_table(result, the_plan), out)
