"""`python -m atr_grpo.results {table2,table3,delta,passk,all,figures} --runs DIR --out DIR`.

Reads only run directories under --runs (found by their config.yaml) and writes the paper's tables as CSV,
Markdown and LaTeX (plus `<table>_vs_paper.md` where the paper publishes the table), or its figures as PNG and
PDF. Each table takes the runs of one experiment (table2 → `table2`, table3 → `table3`, delta → `ablate_delta`,
passk → `passk_curve`); `--experiment` picks another (e.g. `demo` on a CPU). Runs with missing evaluations are
listed in the output and on stderr, never silently dropped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo.reporting import figures, tables
from atr_grpo.reporting.runs import find_runs

TABLES = {"table2": "table2", "table3": "table3", "delta": "ablate_delta", "passk": "passk_curve"}
BUILDERS = {"table2": tables.table2, "table3": tables.table3, "delta": tables.delta_table, "passk": tables.passk_table}
COMMANDS = (*TABLES, "all", "figures")


class ResultsError(RuntimeError):
    pass


def build_table(name: str, runs_dir: Path, out_dir: Path, experiment: str | None = None) -> list[Path]:
    runs = find_runs(runs_dir, experiment or TABLES[name])
    if not runs:
        raise ResultsError(f"{name}: no run directories of experiment {experiment or TABLES[name]!r} under {runs_dir}")
    table = BUILDERS[name](runs)
    for line in table.missing:
        print(f"warning: {name}: {line}", file=sys.stderr)
    return tables.write_table(table, out_dir)


def build_figures(runs_dir: Path, out_dir: Path, experiment: str | None = None) -> tuple[list[Path], list[str]]:
    """Every figure whose data exist; returns (files written, figures skipped with the reason)."""
    written, skipped = figures.figure1(out_dir), []
    curves = find_runs(runs_dir, experiment or "table2")
    if curves:
        written += figures.figure2(curves, out_dir) + figures.figure_clipping(curves, out_dir)
    else:
        skipped.append(f"figure 2 and clipping curves: no runs of experiment {experiment or 'table2'!r}")
    for name, builder, what in (("delta", figures.figure3, "figure 3"), ("passk", figures.figure4, "figure 4")):
        runs = find_runs(runs_dir, TABLES[name] if experiment is None else experiment)
        table = BUILDERS[name](runs) if runs else None
        if table is not None and table.rows:
            written += builder(table, out_dir)
        else:
            skipped.append(f"{what}: no runs of experiment {TABLES[name] if experiment is None else experiment!r}")
    return written, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atr_grpo.results", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("what", help=f"one of {', '.join(COMMANDS)}")
    parser.add_argument("--runs", type=Path, default=Path("results/runs"), help="where the run directories are")
    parser.add_argument("--out", type=Path, default=None, help="output folder (results/tables or results/figures)")
    parser.add_argument("--experiment", default=None, help="take the runs of this experiment instead")
    opts = parser.parse_args(argv)
    if opts.what not in COMMANDS:
        parser.error(f"unknown table {opts.what!r}; allowed: {', '.join(COMMANDS)}")
    if not opts.runs.exists():
        parser.error(f"--runs {opts.runs} does not exist")
    out = opts.out or Path("results/figures" if opts.what == "figures" else "results/tables")
    if opts.what == "figures":
        written, skipped = build_figures(opts.runs, out, opts.experiment)
        for reason in skipped:
            print(f"skipped {reason}", file=sys.stderr)
    else:
        names = list(TABLES) if opts.what == "all" else [opts.what]
        written = []
        for name in names:
            try:
                written += build_table(name, opts.runs, out, opts.experiment)
            except ResultsError as err:
                if opts.what != "all":
                    print(f"error: {err}", file=sys.stderr)
                    return 2
                print(f"skipped {err}", file=sys.stderr)
        if not written:
            print(f"error: no run directories for any table under {opts.runs}", file=sys.stderr)
            return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
