"""Two tables that say whether an experiment can tell rules apart: its endpoints per method, and per run whether
each of the rule's bounds acted at all.

- endpoints: per (experiment and study, model, method, benchmark, metric), over the seeds, the step-0 value
  (`start`), the final and best values and the AUC, each as the mean over seeds with its seed SD (ddof 1), and
  the number of seeds. The AUC of a run is the mean of its evaluations after step 0 (step 0 is the same adapter
  for every method, so it carries no information about the rule): less noisy than the last point, and it counts
  how soon a rule gains as well as where it ends. `auc_minus_start` is the mean over seeds of AUC − step 0.
- parts: the endpoints table of Mean@K's parts (`evaluation.outcomes`): the answered rate, the accuracy given an
  answer (a run's AUC of it is the mean of its steps' ratios) and the truncated share, beside Mean@K, read from the
  per-sample files' grader statuses; a run whose files record none is named and left out.
- bounds: one row per training run: the mean completion length over training (generation steps, from
  metrics.jsonl), and for every `clip/frac_*` key the rule logs (low, high, dual, ...) the fraction of optimizer
  steps on which that bound froze any token (`fired_<bound>`) and its mean frozen fraction (`frac_<bound>`). A
  bound that never fires makes its rule a copy of another (dual_clip's dual bound: clip).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from atr_grpo.reporting.analyses.tables import Table
from atr_grpo.reporting.metric import defaults, parts
from atr_grpo.reporting.runs import (
    AVERAGE,
    MissingSamples,
    Run,
    mean_or_nan,
    mean_std,
    metric_number,
    problems,
    repeat_free,
    run_columns,
)

ENDPOINT_COLUMNS = [
    "experiment",
    "model",
    "method",
    "benchmark",
    "metric",
    "seeds",
    "start",
    "final",
    "final_sd",
    "best",
    "auc",
    "auc_sd",
    "auc_minus_start",
]
BOUND_PREFIX = "clip/frac_"
LENGTH_KEY = "completion_length"


def run_endpoints(run: Run, metric: str, key: str) -> dict[str, float] | None:
    """{start, final, best, auc} of one run for a benchmark (or AVERAGE), in percent; None without evaluations
    after step 0. `start` is nan when step 0 was not evaluated."""
    table = run.eval_table(metric)
    later = [step for step in sorted(table) if step > 0 and key in table[step]]
    if not later:
        return None
    values = [table[step][key] for step in later]
    start = table.get(0, {}).get(key, math.nan)
    return {"start": start, "final": values[-1], "best": max(values), "auc": sum(values) / len(values)}


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return mean_std(values, ddof=1) if values else (math.nan, math.nan)


def endpoints_table(runs: list[Run]) -> Table:
    return _endpoints(runs, "endpoints", defaults)


def parts_table(runs: list[Run]) -> Table:
    """The endpoints of Mean@K and of its parts (`metric.parts`), from the per-sample files."""
    return _endpoints(runs, "parts", lambda k: defaults(k)[:1] + parts(k))


def _endpoints(runs: list[Run], name: str, metrics_of: Callable[[int], list[str]]) -> Table:
    """Per (experiment, model, method, benchmark) and each metric `metrics_of(K)` names, the seeds' endpoints."""
    kept = repeat_free(runs, lambda run: run.max_steps is not None)
    unread: dict[str, str] = {}
    groups: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for run in kept:
        groups[(run.scope, run.model, run.method)].append(run)
    rows = []
    for (experiment, model, method), group in sorted(groups.items()):
        k = group[0].k
        benches = sorted({b for run in group for b in run.benchmarks}) + [AVERAGE]
        for bench in benches if len(benches) > 2 else benches[:1]:  # one benchmark: its average is itself
            for metric in metrics_of(k):
                found = [e for run in group if (e := _read(run, metric, bench, unread)) is not None]
                if not found:
                    continue
                final, final_sd = _mean_sd([e["final"] for e in found])
                auc, auc_sd = _mean_sd([e["auc"] for e in found])
                gains = [e["auc"] - e["start"] for e in found if not math.isnan(e["start"])]
                rows.append(
                    {
                        "experiment": experiment,
                        "model": model,
                        "method": method,
                        "benchmark": bench,
                        "metric": metric,
                        "seeds": len(found),
                        "start": _mean_sd([e["start"] for e in found])[0],
                        "final": final,
                        "final_sd": final_sd,
                        "best": _mean_sd([e["best"] for e in found])[0],
                        "auc": auc,
                        "auc_sd": auc_sd,
                        "auc_minus_start": _mean_sd(gains)[0],
                    }
                )
    notes = [
        "percent; mean over seeds (seed SD with ddof 1); start = step 0, from the adapter the methods of a seed share; "
        "final = last evaluation, best = maximum over evaluations after step 0 (chosen on the same problems, so "
        "biased upward); auc = mean of a run's evaluations after step 0"
    ]
    if name == "parts":
        notes.append(
            "answered@K: the share of the first K samples with an extracted answer; acc_given_answer@K: Σ correct / "
            "Σ answered over the problems of an evaluation (Mean@K = answered@K × acc_given_answer@K); truncated@K: "
            "the share that ran out of tokens; from the per-sample files' grader statuses"
        )
    missing = problems(kept) + [f"{path}: not in {name} ({why})" for path, why in sorted(unread.items())]
    return Table(name, ENDPOINT_COLUMNS, rows, missing, notes)


def _read(run: Run, metric: str, key: str, unread: dict[str, str]) -> dict[str, float] | None:
    """`run_endpoints`, or None with the reason kept in `unread` when its samples cannot give `metric`."""
    if str(run.path) in unread:
        return None
    try:
        return run_endpoints(run, metric, key)
    except MissingSamples as err:
        unread[str(run.path)] = str(err).removeprefix(f"{run.path}: ")
        return None


def bounds_table(runs: list[Run]) -> Table:
    kept = repeat_free(runs, lambda run: bool(run.metrics))
    bounds = sorted(
        {key[len(BOUND_PREFIX) :] for run in kept for row in run.metrics for key in row if key.startswith(BOUND_PREFIX)}
    )
    columns = ["experiment", "model", "method", "seed", "steps", "completion_length", "clip_frac"]
    columns += [f"{kind}_{bound}" for bound in bounds for kind in ("fired", "frac")]
    rows = []
    for run in sorted(kept, key=lambda r: (r.scope, r.model, r.method, r.seed)):
        steps = [row for row in run.metrics if metric_number(row.get("clip/frac")) is not None]
        lengths = [v for row in run.metrics if (v := metric_number(row.get(LENGTH_KEY))) is not None]
        fracs = [float(r["clip/frac"]) for r in steps]
        row: dict[str, Any] = {
            **run_columns(run),
            "steps": len(steps),
            "completion_length": mean_or_nan(lengths),
            "clip_frac": mean_or_nan(fracs),
        }
        for bound in bounds:
            fracs = [v for r in steps if (v := metric_number(r.get(BOUND_PREFIX + bound))) is not None]
            row[f"fired_{bound}"] = mean_or_nan([float(f > 0) for f in fracs])
            row[f"frac_{bound}"] = mean_or_nan(fracs)
        rows.append(row)
    notes = [
        "completion_length = mean completion length in tokens over the generation steps of training; "
        "fired_<bound> = fraction of optimizer steps on which that bound froze any token, frac_<bound> = its "
        "mean frozen fraction; clip_frac = mean clip/frac (any bound); –: the rule has no such bound"
    ]
    formats = dict.fromkeys(columns[5:], ".3g")
    blanks = dict.fromkeys(columns[7:], "–")
    return Table("bounds", columns, rows, [], notes, formats, nan_text=blanks)
