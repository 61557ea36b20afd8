"""The evaluation files of a run directory, written so that nothing is ever lost.

    <run_dir>/eval/step_<step:06d>/<benchmark>.jsonl   one line per (problem, sample); readers also take
                                                        `<benchmark>.jsonl.gz` (`find_sample_file`)
                                                        (`completion_rows` picks a few for W&B's table)
    <run_dir>/eval/summary.jsonl                        one line per (step, benchmark)

The summary line is the commit record: the per-sample file is written completely (temporary file +
rename) before its summary line is appended. Hence:
- a (step, benchmark) with a summary line is done, and a re-run skips it (unless forced);
- a per-sample file without a summary line is an interrupted evaluation: it is moved aside to
  `<benchmark>.jsonl.interrupted-<i>` before the new one is written;
- a forced re-evaluation moves the old per-sample file to `<benchmark>.jsonl.replaced-<i>` and appends a
  new summary line; when a (step, benchmark) has several summary lines, the last one is authoritative
  (`read_summary` returns only those).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.rundir import files, layout, records


def sample_file(run_dir: str | Path, step: int, benchmark: str) -> Path:
    return layout.sample_file(run_dir, step, benchmark)


def find_sample_file(run_dir: str | Path, step: int, benchmark: str) -> Path | None:
    """The per-sample file to read for (step, benchmark): `<benchmark>.jsonl` or its compressed copy
    `<benchmark>.jsonl.gz` (rundir.iter_jsonl reads both); None when neither exists. Both at once is an
    error, since they may differ."""
    plain = sample_file(run_dir, step, benchmark)
    packed = layout.packed(plain)
    if plain.exists() and packed.exists():
        raise ValueError(f"both {plain} and {packed.name} exist: keep one of them")
    return plain if plain.exists() else packed if packed.exists() else None


def read_summary(run_dir: str | Path, whole: bool = False) -> dict[tuple[int, str], dict[str, Any]]:
    """The summary line of every evaluated (step, benchmark)."""
    return read_summary_file(layout.summary_path(run_dir), whole)


def read_summary_file(path: Path, whole: bool = False) -> dict[tuple[int, str], dict[str, Any]]:
    """The line of each (step, benchmark) of a summary file; {} when there is none. A (step, benchmark) recorded
    twice is refused (`records.summary_lines`); with `whole`, a torn last line is refused too."""
    return {(row["step"], row["benchmark"]): row for row in records.summary_lines(path, whole)}


def move_aside(path: Path, tag: str) -> Path:
    """Rename `path` to the first free `<path>.<tag>-<i>`; returns the new name."""
    for i in range(1, 100_000):
        target = path.with_name(f"{path.name}.{tag}-{i}")
        if not target.exists():
            path.rename(target)
            return target
    raise RuntimeError(f"no free name to move {path} aside")


def write_samples(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Write the per-sample file through a temporary file, so that a partial file never has the real name."""
    files.write_jsonl(path, records)


COMPLETION_COLUMNS = ("problem_id", "sample", "prompt", "completion", "gold", "extracted", "status")


def completion_rows(run_dir: str | Path, step: int, benchmark: str, limit: int) -> list[dict[str, Any]]:
    """At most `limit` samples of one evaluation, as rows of COMPLETION_COLUMNS: the first sample of each problem
    in file order, then the second of each, and so on, so that the rows span `limit` problems when there are that
    many. `prompt` is the problem statement (the chat template around it is the run's prompt config); a file
    written before the per-sample lines held the problem has None there. [] when the per-sample file is absent."""
    path = find_sample_file(run_dir, step, benchmark)
    if path is None or limit <= 0:
        return []
    records = list(rundir.iter_jsonl(path))
    order = {pid: i for i, pid in enumerate(dict.fromkeys(str(r["problem_id"]) for r in records))}
    records.sort(key=lambda r: (int(r["sample"]), order[str(r["problem_id"])]))
    renamed = {"prompt": "problem"}  # the table's column → the per-sample line's field
    return [{column: r.get(renamed.get(column, column)) for column in COMPLETION_COLUMNS} for r in records[:limit]]
