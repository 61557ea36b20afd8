"""`python -m atr_grpo.results figures`: every figure whose runs exist, the others named with the reason."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo.reporting import plan
from atr_grpo.reporting.analyses import tables
from atr_grpo.reporting.commands import options
from atr_grpo.reporting.commands.tables import experiment_of, make_parser
from atr_grpo.reporting.methods import UnknownMethod, method_named
from atr_grpo.reporting.render import figures, writers
from atr_grpo.reporting.runs import MissingSamples, Run, repeat_free
from atr_grpo.reporting.selection import ResultsError, checked_runs, read_runs, select


def main(argv: list[str]) -> int:
    """`argv` after the word `figures`, which the parser it shares with the tables reads as its `what`."""
    parser = make_parser()
    return run(parser.parse_args(["figures", *argv]), parser)


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = opts.out or Path("results/figures")
    runs = read_runs(parser, opts)
    runs = checked_runs(runs, opts.experiment)
    try:  # each name as shown or in its ASCII form
        names = {r.method for r in runs if r.config}
        methods = [method_named(m, names, "--methods") for m in options.split(opts.methods) or []] or None
    except UnknownMethod as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        with writers.staged(out) as stage:
            written, skipped = build_figures(runs, opts.runs, stage, opts.experiment, methods, opts.study)
            written = [out / path.relative_to(stage) for path in written]
    except (ResultsError, writers.OutputError, plan.PlanError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for reason in skipped:
        print(f"skipped {reason}", file=sys.stderr)
    for path in written:
        print(path)
    return 0


def build_figures(
    runs: list[Run],
    runs_dir: Path,
    out_dir: Path,
    experiment: str | None = None,
    methods: list[str] | None = None,
    study: str | None = None,
) -> tuple[list[Path], list[str]]:
    """Every figure whose data exist, each from the runs its table takes (`experiment_of`); returns (files written,
    figures skipped with the reason)."""
    written, skipped = figures.figure1(out_dir), []
    try:
        curves = repeat_free(select(runs, runs_dir, experiment_of("table2", experiment, study)))
        written += figures.figure2(curves, out_dir, methods=methods)
        written += figures.figure_clipping(curves, out_dir, methods=methods)
        try:
            written += figures.figure_parts(curves, out_dir, methods=methods)
        except MissingSamples as err:
            skipped.append(f"parts_curves: {err}")
            writers.remove_stale(out_dir, "parts_curves")
    except ResultsError as err:
        skipped.append(f"figure 2, clipping and parts curves: {err}")
        for stem in ("figure2_training_curves", "clipping_curves", "parts_curves"):
            writers.remove_stale(out_dir, stem)
    try:
        chosen = select(runs, runs_dir, experiment_of("delta", experiment, study))
        reason = tables.one_delta_reason(tables.delta_groups(chosen))
        if reason is not None:
            raise ResultsError(reason)
        written += figures.figure3(chosen, out_dir)
    except ResultsError as err:
        skipped.append(f"figure3_delta: {err}")
        writers.remove_stale(out_dir, "figure3_delta")
    try:
        table = tables.passk_table(select(runs, runs_dir, experiment_of("passk", experiment, study)))
        if not table.rows:
            raise ResultsError("the runs have no per-sample files")
        written += figures.figure4(table, out_dir, methods)
    except ResultsError as err:
        skipped.append(f"figure4: {err}")
        writers.remove_stale(out_dir, "figure4_passk")
    return written, skipped
