"""`python -m atr_grpo.results regrade`: every saved sample re-scored with the current grader."""

from __future__ import annotations

import argparse
import sys

from atr_grpo.evaluation.grader import DEFAULT_TIMEOUT
from atr_grpo.reporting import regrade
from atr_grpo.reporting.commands import options
from atr_grpo.reporting.selection import of_experiment, read_runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.results regrade",
        description=regrade.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_run_options(parser, statistics=False)
    parser.add_argument("--workers", type=int, default=None, help="grading processes (default: one per CPU)")
    parser.add_argument(
        "--timeout", type=options.seconds, default=DEFAULT_TIMEOUT, help="seconds per answer (default 5)"
    )
    parser.add_argument("--examples", type=int, default=3, help="changed verdicts shown per run and benchmark")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    runs = [r for r in of_experiment(read_runs(parser, opts), opts.experiment) if r.config]
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
    for graded in runs:
        warn = lambda line: print(f"warning: {line}", file=sys.stderr)  # noqa: E731
        found = regrade.regrade_run(
            graded.path,
            identity,
            opts.workers,
            opts.timeout,
            opts.examples,
            not opts.no_progress,
            warn,
            graded.credit_inside_think,
        )
        for line in regrade.format_changes(found):
            print(line)
        total += sum(c.samples for c in found)
        changed += sum(c.changed for c in found)
    print(
        f"{changed} of {total} verdicts changed in {len(runs)} runs; summaries in "
        f"{regrade.summary_path('<run>', identity['tag'])} (tables: --grader {identity['tag']})"
    )
    return 0
