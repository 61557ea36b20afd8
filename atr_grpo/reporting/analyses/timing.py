"""Where a training run's time went, one row per run, from its own files.

- `wall_s`: DONE's `seconds`, from the start of the SFT stage to the last step. It holds building the SFT adapter
  when this run built it (the first run of a start point; later ones read it from the cache), not the process's
  imports and config checks.
- `train_s`: the sum of metrics.jsonl's `step_time` over the optimizer steps. A step that starts a rollout holds
  its generation, so this is rollouts plus optimizer steps.
- `eval_s` and `evals`: the evaluations this run ran itself (their summary lines' `time_s`, one per benchmark and
  step). A step 0 copied from another run (`eval.share_start`, its line names `shared_start`) costs nothing here.
- `other_s`: the rest, wall − train − eval: the SFT stage, the trainer's setup, saving adapters.

A run without DONE (not finished) has no wall time: its row shows – there.

A resumed run ran in stretches, one per launch: env.json's `start_time`, then one entry per resume in `resumes`,
each with its own `start_time`. DONE's `seconds` covers the last stretch only, so its `wall_s` adds each earlier
stretch from its start to the next one's (the wait before a relaunch included: an upper bound), and its `train_s`
adds the steps it logged and later set aside (metrics.discarded.jsonl), since that work was done too. The table
then has a `stretches` column. A relaunch of a finished run trains nothing and records no resume.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from atr_grpo.reporting.analyses.tables import Table
from atr_grpo.reporting.runs import Run, metric_number, repeat_free, run_columns
from atr_grpo.rundir import files, layout, records

START_FORMAT = "%Y-%m-%dT%H:%M:%S%z"  # env.json's start_time (`run_environment.environment`)

COLUMNS = ["experiment", "model", "method", "seed", "wall_s", "train_s", "eval_s", "evals", "other_s"]


def stretch_starts(run: Run) -> list[datetime | None]:
    """When each launch of the run started (env.json's `start_time`, then each resume's); None where a start time
    is missing or unreadable, [] without env.json."""
    path = layout.env_path(run.path)
    if not path.is_file():
        return []
    env = files.read_json(path)
    launches = [env, *(env.get("resumes") or [])]
    return [_parsed(launch.get("start_time")) if isinstance(launch, dict) else None for launch in launches]


def _parsed(text: Any) -> datetime | None:
    try:
        return datetime.strptime(str(text), START_FORMAT)
    except ValueError:
        return None


def run_seconds(run: Run) -> float:
    """The run's wall time: DONE's `seconds`, plus each earlier stretch's span from its start to the next start
    when it was resumed (math.nan without DONE, without a time in it, or with a stretch's start unknown)."""
    done = records.read_done(run.path)
    seconds = metric_number(done.seconds) if done is not None else None
    starts = stretch_starts(run)
    known = [start for start in starts if start is not None]
    if seconds is None or (len(starts) > 1 and len(known) < len(starts)):
        return math.nan
    return seconds + sum((after - before).total_seconds() for before, after in zip(known, known[1:]))


def _step_seconds(lines: list[dict[str, Any]]) -> float:
    return sum(v for row in lines if (v := metric_number(row.get("step_time"))) is not None)


def timing_row(run: Run) -> dict[str, Any]:
    evaluated = [row for row in run.summary.values() if not row.get("shared_start")]
    eval_s = sum(metric_number(row.get("time_s")) or 0.0 for row in evaluated)
    stretches = max(len(stretch_starts(run)), 1)
    set_aside = Path(run.path) / layout.DISCARDED_METRICS_FILE
    train_s = _step_seconds(run.metrics)
    if stretches > 1 and set_aside.is_file():
        train_s += _step_seconds(files.read_jsonl(set_aside, whole=True))
    wall_s = run_seconds(run)
    return {
        **run_columns(run),
        "wall_s": wall_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "evals": len(evaluated),
        "other_s": wall_s - train_s - eval_s,
        "stretches": stretches,
    }


def timing_table(runs: list[Run]) -> Table:
    kept = repeat_free(runs, lambda run: run.is_training)
    rows = [timing_row(run) for run in sorted(kept, key=lambda r: (r.scope, r.model, r.method, r.seed))]
    resumed = [row for row in rows if row["stretches"] > 1]
    columns = COLUMNS + ["stretches"] * bool(resumed)
    notes = [
        "wall_s = DONE's seconds (SFT stage to last step); train_s = sum of step_time (rollouts and optimizer "
        "steps); eval_s = the evaluations this run ran itself (evals of them; a shared step 0 is not counted); "
        "other_s = wall_s − train_s − eval_s (the SFT stage when this run built it, setup, saving)"
    ]
    walls = [row["wall_s"] for row in rows if not math.isnan(row["wall_s"])]
    if walls:
        notes.append(
            f"{len(walls)} finished runs: {sum(walls):.0f} s of run time in all, median {statistics.median(walls):.1f} "
            f"s a run ({min(walls):.1f}–{max(walls):.1f}); with several runs at once the command's wall time is less"
        )
    notes += _span_notes(kept)
    if resumed:
        listed = ", ".join(f"{row['method']} seed {row['seed']} ({row['stretches']})" for row in resumed)
        notes.append(
            f"resumed runs, in stretches (launches): {listed}; their wall_s adds each earlier stretch from its start "
            f"to the next one's ({layout.ENV_FILE}), the wait before a relaunch included, and their train_s the steps "
            "set aside on resume"
        )
    unfinished = [row for row in rows if math.isnan(row["wall_s"])]
    missing = [f"{row['method']} seed {row['seed']}: {_no_wall(row)}" for row in unfinished]
    formats = {"wall_s": ".1f", "train_s": ".1f", "eval_s": ".1f", "other_s": ".1f"}
    return Table("timing", columns, rows, missing, notes, formats, nan_text={"wall_s": "–", "other_s": "–"})


def _no_wall(row: dict[str, Any]) -> str:
    if row["stretches"] > 1:
        stretches = row["stretches"]
        return f"no wall time (not finished, or a stretch of its {stretches} without a start time in {layout.ENV_FILE})"
    return "no DONE (not finished)"


def _span_notes(runs: list[Run]) -> list[str]:
    """The experiment's wall time, from the first run's start to the last run's end (its last stretch's start plus
    DONE's seconds; a start is recorded once the base model is there), and the time of the evaluations inside the
    run folders (a plan's final evaluation), which ran after them."""
    spans = []
    for run in runs:
        starts, done = stretch_starts(run), records.read_done(run.path)
        seconds = metric_number(done.seconds) if done is not None else None
        if starts and all(start is not None for start in starts) and seconds is not None:
            spans.append((starts[0], starts[-1].timestamp() + seconds))
    notes = []
    if len(spans) > 1:
        first, last = min(start for start, _ in spans), max(end for _, end in spans)
        minutes = (last - first.timestamp()) / 60
        notes.append(
            f"first start to last end: {minutes:.1f} min ({first.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC and "
            f"on; {layout.ENV_FILE} start_time, then the last stretch's start + {layout.DONE_FILE}'s seconds): the "
            f"wall time of these {len(spans)} runs, runs at once counted once; a start_time is written once the run's "
            "base model is there, so a base model built by the first run is not in it"
        )
    inner = [(folder.name, row) for run in runs for folder, row in _inner_evaluations(run)]
    if inner:
        names = ", ".join(sorted({name for name, _ in inner}))
        seconds = sum(metric_number(row.get("time_s")) or 0.0 for _, row in inner)
        notes.append(
            f"evaluations inside the run folders ({names}/, e.g. a plan's final evaluation): {len(inner)} of them, "
            f"{seconds / 60:.1f} min of evaluation in all (their wall time, or less with several at once), after "
            "the runs"
        )
    return notes


def _inner_evaluations(run: Run) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, summary line) of each evaluation in a standalone evaluation folder inside the run (one with an
    eval/request.json)."""
    from atr_grpo.evaluation.outputs import read_summary

    folders = sorted(p for p in Path(run.path).iterdir() if p.is_dir() and layout.request_path(p).is_file())
    return [(folder, row) for folder in folders for row in read_summary(folder).values()]
