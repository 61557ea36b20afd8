"""`python -m atr_grpo.results {table2,table3,delta,passk,all,figures} --runs DIR --out DIR`

Reads only the run directories under --runs (found by their config.yaml) and writes the paper's tables as
CSV, Markdown and LaTeX, plus `<table>_vs_paper.md` where the paper publishes the numbers
(results/paper/), or its figures as PNG and PDF. Each table takes the runs of one experiment:
  table2 → table2, table3 → table3, delta → ablate_delta (Figure 3), passk → passk_curve (Figure 4);
  figures 2 and the clipping curves → table2. --experiment takes another (e.g. `demo` on a CPU).
`all` builds every table whose runs exist and names the others. Runs with missing evaluations are listed
in the outputs and on stderr, never silently dropped. Only files this command wrote are ever overwritten.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo.reporting import figures, tables
from atr_grpo.reporting.runs import Run, drop_repeats, find_runs

TABLES = {"table2": "table2", "table3": "table3", "delta": "ablate_delta", "passk": "passk_curve"}
COMMANDS = (*TABLES, "all", "figures")


class ResultsError(RuntimeError):
    pass


def _select(runs: list[Run], runs_dir: Path, experiment: str) -> list[Run]:
    chosen = [run for run in runs if run.experiment == experiment]
    if chosen:
        return chosen
    found: dict[str, int] = {}
    for run in runs:
        found[run.experiment] = found.get(run.experiment, 0) + 1
    if not found:
        raise ResultsError(f"no run directories (folders with a config.yaml) under {runs_dir}")
    listing = ", ".join(f"{name} ({n} runs)" for name, n in sorted(found.items()))
    raise ResultsError(f"no runs of experiment {experiment!r} under {runs_dir} (found: {listing}); "
                       "--experiment NAME tabulates another")  # fmt: skip


def build_table(name: str, runs: list[Run], runs_dir: Path, out_dir: Path, experiment: str | None = None,
                ddof: int = 0) -> list[Path]:  # fmt: skip
    """Write one table from the runs of its experiment; raises ResultsError when there are none."""
    chosen = _select(runs, runs_dir, experiment or TABLES[name])
    table = tables.table3(chosen, ddof=ddof) if name == "table3" else tables.BUILDERS[name](chosen)
    for line in table.missing:
        print(f"warning: {name}: {line}", file=sys.stderr)
    return tables.write_table(table, out_dir)


def build_figures(runs: list[Run], runs_dir: Path, out_dir: Path, experiment: str | None = None,
                  methods: list[str] | None = None) -> tuple[list[Path], list[str]]:  # fmt: skip
    """Every figure whose data exist; returns (files written, figures skipped with the reason)."""
    written, skipped = figures.figure1(out_dir), []
    try:
        curves, _ = drop_repeats(_select(runs, runs_dir, experiment or "table2"))
        written += figures.figure2(curves, out_dir, methods=methods)
        written += figures.figure_clipping(curves, out_dir, methods=methods)
    except ResultsError as err:
        skipped.append(f"figure 2 and clipping curves: {err}")
        for stem in ("figure2_training_curves", "clipping_curves"):
            tables.remove_stale(out_dir, stem)
    for name, builder, stem in (("delta", figures.figure3, "figure3_delta"), ("passk", figures.figure4, "figure4")):
        try:
            table = tables.BUILDERS[name](_select(runs, runs_dir, experiment or TABLES[name]))
            if not table.rows:
                raise ResultsError(f"the runs have no {'ATR δ values' if name == 'delta' else 'per-sample files'}")
            written += builder(table, out_dir)
        except ResultsError as err:
            skipped.append(f"{stem}: {err}")
            tables.remove_stale(out_dir, stem if name == "delta" else "figure4_passk")
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atr_grpo.results", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("what", help=f"one of {', '.join(COMMANDS)}")
    parser.add_argument("--runs", type=Path, default=Path("results/runs"), help="where the run directories are")
    parser.add_argument("--out", type=Path, default=None, help="output folder (results/tables or results/figures)")
    parser.add_argument("--experiment", default=None, help="take the runs of this experiment for every output")
    parser.add_argument("--ddof", type=int, choices=(0, 1), default=0,
                        help="table3's std over seeds: 0 as in the paper (default), 1 for the sample std")  # fmt: skip
    parser.add_argument("--methods", default=None, help="figures: comma-separated methods to draw (default all)")
    opts = parser.parse_args(argv)
    if opts.what not in COMMANDS:
        parser.error(f"unknown table {opts.what!r}; allowed: {', '.join(COMMANDS)}")
    if not opts.runs.is_dir():
        parser.error(f"--runs {opts.runs} is not a directory")
    out = opts.out or Path("results/figures" if opts.what == "figures" else "results/tables")
    runs = find_runs(opts.runs)
    for run in runs:
        if not run.config:  # it cannot be placed in any table: say so here
            print(f"warning: {run.path}: {'; '.join(run.problems)}", file=sys.stderr)
    written: list[Path] = []
    try:
        if opts.what == "figures":
            methods = opts.methods.split(",") if opts.methods else None
            written, skipped = build_figures(runs, opts.runs, out, opts.experiment, methods)
            for reason in skipped:
                print(f"skipped {reason}", file=sys.stderr)
        elif opts.what != "all":
            written = build_table(opts.what, runs, opts.runs, out, opts.experiment, opts.ddof)
        else:
            for name in TABLES:
                try:
                    written += build_table(name, runs, opts.runs, out, opts.experiment, opts.ddof)
                except ResultsError as err:
                    print(f"skipped {name}: {err}", file=sys.stderr)
                    tables.remove_stale(out, name)
            if not written:
                raise ResultsError(f"none of {', '.join(TABLES)} has runs under {opts.runs}")
    except (ResultsError, tables.OutputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
