"""`python -m atr_grpo.results COMMAND ...`: the paper's tables and figures, and the comparisons, rebuilt from run
directories. Each command lives in `atr_grpo/reporting/commands/`; `python -m atr_grpo.results --help` describes
the tables and figures, `python -m atr_grpo.results COMMAND --help` the others.

  TABLE or all   one table, or every table the runs support (commands/tables.py)
  figures        every figure whose runs exist (commands/figures.py)
  compare        method A − method B, or two evaluation folders with --eval (commands/compare.py)
  regrade        every saved sample re-scored with the current grader (commands/regrade.py)
  pack           the per-sample files compressed in place (commands/pack.py)
  diverge        where two runs expected to be the same run part (commands/diverge.py)

A damaged run file, or two runs of one point and seed, stops every command with exit status 2.
"""

from __future__ import annotations

import sys

from atr_grpo import rundir
from atr_grpo.reporting.commands import compare, diverge, figures, pack, regrade, tables
from atr_grpo.reporting.runs import RepeatedRuns
from atr_grpo.reporting.selection import ResultsError

__all__ = ["COMMANDS", "TABLES", "ResultsError", "main"]

TABLES = tables.TABLES
COMMANDS = tables.COMMANDS
# the commands with their own options; any other first word names a table (or `all`)
SUBCOMMANDS = {
    "figures": figures.main,
    "compare": compare.main,
    "regrade": regrade.main,
    "pack": pack.main,
    "diverge": diverge.main,
}

# what follows a damaged run file's name and line
DAMAGED_FILE_HINT = (
    "the results commands read every line of a run's files: repair or remove the damaged line (a torn last line is "
    "a record whose write was cut off), or move the run out of --runs"
)


def main(argv: list[str] | None = None) -> int:
    """Run one command; a damaged run file stops it with the file and line named (exit status 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = SUBCOMMANDS.get(argv[0]) if argv else None
    try:
        return command(argv[1:]) if command else tables.main(argv)
    except rundir.RunFileError as err:
        print(f"error: {err}\n{DAMAGED_FILE_HINT}", file=sys.stderr)
        return 2
    except RepeatedRuns as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
