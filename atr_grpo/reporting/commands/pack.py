"""`python -m atr_grpo.results pack`: the per-sample files compressed in place (`reporting/pack.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo.reporting import pack


def main(argv: list[str]) -> int:
    """Exit status 0, or 2 with the refusal on stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.results pack",
        description=pack.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv), parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=Path, required=True, help="a folder of run directories")


def run(opts: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not opts.runs.is_dir():
        parser.error(f"--runs {opts.runs} is not a directory")
    try:
        done = pack.pack_runs(opts.runs)
    except pack.PackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    before, after = sum(b for _, b, _ in done), sum(a for _, _, a in done)
    print(f"packed {len(done)} per-sample files under {opts.runs}: {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")
    return 0
