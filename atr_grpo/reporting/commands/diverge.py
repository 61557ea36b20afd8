"""`python -m atr_grpo.results diverge RUN_A RUN_B`: where two runs expected to be the same run part
(`analyses/divergence.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo import rundir
from atr_grpo.reporting.analyses import divergence
from atr_grpo.reporting.runs import load_run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atr_grpo.results diverge", description=divergence.__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    runs = []
    for path in (opts.run_a, opts.run_b):
        if not (path / rundir.CONFIG_FILE).is_file():
            print(f"error: {path} is not a run directory (no {rundir.CONFIG_FILE})", file=sys.stderr)
            return 2
        runs.append(load_run(path))
    print(divergence.report(*runs, divergence.divergence(*runs)), end="")
    return 0
