"""Step 0 evaluated once, shared by every run that starts from the same adapter (eval.share_start).

Step 0 is the SFT adapter before any GRPO update. Every method and seed of an experiment starts from the same
adapter and evaluates it under the same evaluation seed, so all their step-0 evaluations are the same samples:
computing it once per experiment instead of once per run saves one evaluation a run.

The first run to reach step 0 evaluates it as usual (into its own run directory) and copies the per-sample files
and summary lines into the cache, under a key of everything that decides the samples: the starting point's
weights (env.json start_point), the evaluation settings, the task, the prompt, the torch threads, the package
versions and the names of the scores a summary line holds (so that an entry cached before a score existed, such as
the parts of Mean@K, is not reused for runs that expect it: their summaries would show "-"). Later runs copy them
from there; their summary line says where it came from (`shared_start`). A file lock makes a second run that
reaches step 0 while the first is evaluating wait for it instead of repeating it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from atr_grpo import run_environment, rundir
from atr_grpo.cache import cache_dir
from atr_grpo.evaluation.outcomes import summary_scores
from atr_grpo.evaluation.outputs import find_sample_file, move_aside, read_summary, sample_file
from atr_grpo.evaluation.runner import flat_metrics
from atr_grpo.provenance import identity, read_start_point
from atr_grpo.rundir import layout

# the evaluation keys that do not change step 0's samples
SCHEDULE_KEYS = ("enabled", "when", "keep_adapters", "every_steps", "at_start", "share_start")
# summary fields that belong to the run, not to the evaluation (training/evaluations.py `_metadata`)
RUN_FIELDS = ("model", "method", "seed", "adapter_step", "shared_start")


def start_key(cfg: Any, start: dict[str, Any]) -> str:
    """The cache key of step 0's evaluation for runs of `cfg` (a TrainConfig) starting from `start`."""
    import torch

    evaluation = {k: v for k, v in asdict(cfg.eval).items() if k not in SCHEDULE_KEYS}
    payload = {
        "start": list(identity(start)),
        "eval": evaluation,
        "data": asdict(cfg.data),
        "prompt": asdict(cfg.prompt),
        "threads": torch.get_num_threads(),  # float sums (hence samples) may depend on the thread count
        "packages": run_environment.package_versions(("torch", "transformers", "peft", "math-verify")),
        "scores": sorted(summary_scores([["correct"]])),  # a new score makes older entries stale
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _copy(source: Path, target: Path, benchmarks: list[str], extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Step 0's per-sample files and summary lines from `source` to `target` (skipping what `target` has)."""
    have, rows = read_summary(target), {}
    for bench, row in sorted(read_summary(source).items()):
        if row["step"] != 0 or bench[1] not in benchmarks:
            continue
        if bench in have:
            rows[bench[1]] = have[bench]
            continue
        sample = find_sample_file(source, 0, bench[1])
        if sample is None:
            raise FileNotFoundError(f"{source}: step 0, {bench[1]}: summary line without its per-sample file")
        destination = sample_file(target, 0, bench[1]).with_name(sample.name)
        destination.parent.mkdir(parents=True, exist_ok=True)
        if destination.exists():  # an interrupted evaluation's file (no summary line): kept aside, as the runner does
            move_aside(destination, "interrupted")
        shutil.copyfile(sample, destination.with_name(f".{destination.name}.tmp"))
        destination.with_name(f".{destination.name}.tmp").rename(destination)
        line = {k: v for k, v in row.items() if k not in RUN_FIELDS} | extra
        rundir.append_jsonl(rundir.summary_path(target), line)  # the commit record, written last
        rows[bench[1]] = line
    return rows


def evaluate_start_once(
    cfg: Any, run_dir: Path, benchmarks: list[str], metadata: dict[str, Any], evaluate: Callable[[], dict]
) -> dict[str, float]:
    """Step 0 of `run_dir`: from the shared cache when another run has evaluated it, else by `evaluate()` (which
    writes into `run_dir`), then stored for the next runs. Returns the logger's flat metrics."""
    start = read_start_point(run_dir)
    if start is None:  # nothing to key the evaluation by: evaluate it here
        return evaluate()
    key = start_key(cfg, start)
    entry = cache_dir("start_evals") / key
    with rundir.file_lock(entry.with_name(f"{key}.lock")):
        if not layout.summary_path(entry).exists():
            metrics = evaluate()
            staging = layout.staging_dir(entry)
            shutil.rmtree(staging, ignore_errors=True)  # an interrupted copy: ours to remove
            _copy(run_dir, staging, benchmarks, {})
            staging.rename(entry)
            return metrics
    rows = _copy(entry, run_dir, benchmarks, metadata | {"shared_start": key})
    missing = sorted(set(benchmarks) - set(rows))
    if missing:  # a cache entry made with fewer benchmarks: evaluate the rest here
        return evaluate()
    return flat_metrics(rows, cfg.eval.k)
