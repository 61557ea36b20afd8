"""Does the clipping rule act, or does it react to numerical noise? One row per run, from metrics.jsonl.

- `binding_steps`: the fraction of logged optimizer steps on which the rule froze any token (`clip/frac` > 0);
  `clip_frac`: the mean `clip/frac` over steps.
- The noise floor of the ratio w = π_θ / π_old. TRL recomputes π_old's log-probs for each generation batch
  when a batch feeds several optimizer steps (`rollout.steps_per_generation` > `trainer.gradient_accumulation_steps`,
  or `rollout.num_iterations` > 1). The first optimizer step after a generation runs on the weights that
  computed π_old, so its w differs from 1 by numerics only (batch shapes, kernels). With `logging_steps` = 1,
  logged step s is such a step when (s − 1) is a multiple of the optimizer steps per rollout
  (steps_per_generation / gradient_accumulation_steps × num_iterations). `noise_floor` is the median over those
  steps of max(ratio/max − 1, 1 − ratio/min) and `noise_floor_max` its largest value (ratio/min and ratio/max
  are the step's micro-batch extremes, averaged over its micro-batches as TRL logs them); `clip_frac_fresh` and
  `clip_frac_reused` split `clip/frac` between those steps and the others. A rule whose `clip_frac_reused` is
  not above its `clip_frac_fresh`, or whose bounds lie within the noise floor, is reacting to noise.
  On-policy runs (one optimizer step per rollout) never recompute π_old: w ≡ 1 exactly, floor 0.
- The rollout engine against the trainer, when logged: the means over steps of `rollout/logp_abs_diff_mean`,
  `rollout/logp_abs_diff_max` and `rollout/ratio_out_of_band_frac` (tokens with π_old / π_rollout outside
  [0.9, 1.1]); nan and "not logged" otherwise.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from atr_grpo import rundir
from atr_grpo.reporting.analyses.tables import Table
from atr_grpo.reporting.runs import Run, mean_or_nan, metric_number, repeat_free, run_columns

ROLLOUT_KEYS = ("rollout/logp_abs_diff_mean", "rollout/logp_abs_diff_max", "rollout/ratio_out_of_band_frac")
COLUMNS = [
    "experiment",
    "model",
    "method",
    "seed",
    "steps",
    "steps_per_rollout",
    "binding_steps",
    "clip_frac",
    "clip_frac_fresh",
    "clip_frac_reused",
    "noise_floor",
    "noise_floor_max",
    *(key.split("/")[1] for key in ROLLOUT_KEYS),
]


def steps_per_rollout(run: Run) -> tuple[int | None, str]:
    """(optimizer steps that share one generation batch, or None with the reason it is unknown)."""
    trainer, rollout = run.config.get("trainer") or {}, run.config.get("rollout") or {}
    try:
        accumulation = int(trainer.get("gradient_accumulation_steps", 1))
        per_generation = int(rollout.get("steps_per_generation") or accumulation)
        iterations = int(rollout.get("num_iterations", 1))
        logging = int(trainer.get("logging_steps", 1))
    except (TypeError, ValueError) as err:  # e.g. an unresolved interpolation in config.yaml
        return None, f"rollout settings unreadable ({err})"
    if logging != 1:
        return None, f"trainer.logging_steps = {logging}: logged steps are averages, no step is known to be fresh"
    return per_generation // accumulation * iterations, ""


def binding_row(run: Run) -> tuple[dict[str, Any], list[str]]:
    """The run's row and what could not be computed, in words."""
    steps = [r for r in run.metrics if metric_number(r.get("clip/frac")) is not None]
    per_rollout, why = steps_per_rollout(run)
    notes = [] if per_rollout is not None else [f"{run.path}: no noise floor: {why}"]
    if not steps:
        notes.append(f"{run.path}: no clip/frac in {rundir.METRICS_FILE}")
    fracs = [float(r["clip/frac"]) for r in steps]
    row: dict[str, Any] = {
        **run_columns(run),
        "steps": len(steps),
        "steps_per_rollout": per_rollout or "?",
        "binding_steps": mean_or_nan([float(f > 0) for f in fracs]),
        "clip_frac": mean_or_nan(fracs),
    }
    fresh = [r for r in steps if per_rollout and (int(r["step"]) - 1) % per_rollout == 0]
    reused = [r for r in steps if per_rollout and (int(r["step"]) - 1) % per_rollout != 0]
    spreads = []
    for r in fresh:
        low, high = metric_number(r.get("ratio/min")), metric_number(r.get("ratio/max"))
        if low is not None and high is not None:
            spreads.append(max(high - 1.0, 1.0 - low))
    row["clip_frac_fresh"] = mean_or_nan([float(r["clip/frac"]) for r in fresh])
    row["clip_frac_reused"] = mean_or_nan([float(r["clip/frac"]) for r in reused])
    row["noise_floor"] = statistics.median(spreads) if spreads else math.nan
    row["noise_floor_max"] = max(spreads) if spreads else math.nan
    if per_rollout and fresh and not spreads:
        notes.append(f"{run.path}: no ratio/min, ratio/max in {rundir.METRICS_FILE}: no noise floor")
    for key in ROLLOUT_KEYS:
        row[key.split("/")[1]] = mean_or_nan([v for r in steps if (v := metric_number(r.get(key))) is not None])
    return row, notes


def binding_table(runs: list[Run]) -> Table:
    """`clip_binding`: one row per training run (RepeatedRuns when two runs repeat a point)."""
    kept = repeat_free(runs)
    rows, missing = [], []
    for run in kept:
        row, notes = binding_row(run)
        missing += notes
        if row["steps"]:
            rows.append(row)
    rows.sort(key=lambda r: (r["experiment"], r["model"], r["method"], r["seed"]))
    notes = [
        "binding_steps = fraction of optimizer steps with clip/frac > 0; clip_frac = mean clip/frac; "
        "clip_frac_fresh / clip_frac_reused = mean clip/frac on the first optimizer step after each generation "
        "(weights unchanged since π_old was computed) / on the others",
        "noise_floor = median over those first steps of max(ratio/max − 1, 1 − ratio/min): the spread of w from "
        "numerics alone (noise_floor_max: the largest); a rule whose bounds lie inside it acts on noise",
        "logp_abs_diff_mean / _max, ratio_out_of_band_frac: the rollout engine against the trainer (|Δ log p|, "
        "fraction of tokens with π_old / π_rollout outside [0.9, 1.1]), mean over steps",
    ]
    formats = dict.fromkeys(COLUMNS[6:], ".3g")
    blanks = {key.split("/")[1]: "not logged" for key in ROLLOUT_KEYS}
    return Table("clip_binding", COLUMNS, rows, missing, notes, formats, nan_text=blanks)
