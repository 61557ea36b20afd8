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
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from atr_grpo.reporting.analyses.tables import Table
from atr_grpo.reporting.runs import Run, metric_number, repeat_free, run_columns
from atr_grpo.rundir import records

COLUMNS = ["experiment", "model", "method", "seed", "wall_s", "train_s", "eval_s", "evals", "other_s"]


def run_seconds(run: Run) -> float:
    """DONE's `seconds` (math.nan when the run has no DONE or it names no time)."""
    done = records.read_done(run.path)
    seconds = metric_number(done.seconds) if done is not None else None
    return math.nan if seconds is None else seconds


def timing_row(run: Run) -> dict[str, Any]:
    evaluated = [row for row in run.summary.values() if not row.get("shared_start")]
    eval_s = sum(metric_number(row.get("time_s")) or 0.0 for row in evaluated)
    train_s = sum(v for row in run.metrics if (v := metric_number(row.get("step_time"))) is not None)
    wall_s = run_seconds(run)
    return {
        **run_columns(run),
        "wall_s": wall_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "evals": len(evaluated),
        "other_s": wall_s - train_s - eval_s,
    }


def timing_table(runs: list[Run]) -> Table:
    kept = repeat_free(runs, lambda run: run.is_training)
    rows = [timing_row(run) for run in sorted(kept, key=lambda r: (r.scope, r.model, r.method, r.seed))]
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
    unfinished = [row for row in rows if math.isnan(row["wall_s"])]
    missing = [f"{row['method']} seed {row['seed']}: no DONE (not finished)" for row in unfinished]
    formats = {"wall_s": ".1f", "train_s": ".1f", "eval_s": ".1f", "other_s": ".1f"}
    return Table("timing", COLUMNS, rows, missing, notes, formats, nan_text={"wall_s": "–", "other_s": "–"})
