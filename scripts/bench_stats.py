"""Intervals and tests on a Table-2-sized tree: how long they take next to reading the per-sample files.

    python scripts/bench_stats.py [--resamples R] [--chars C] [--seeds S] [--repeat N]

The tree is written to a temporary folder: 2 models × 7 methods (14 runs with --seeds 1, as the paper's Table 2;
--seeds 3 gives Table 3's pooling), evaluated on amc23 (40 problems), aime24 and aime25 (30 each) with 8 samples
every 50 steps up to 500, per-sample files (completions of C characters) at step 0 and the last step, the ones
the table reads. Three timings, each the fastest of --repeat: `read` loads the per-sample files the table needs,
`statistics` builds table2 with them already loaded (bootstrap intervals, seed- and problem-level tests, Holm),
`total` both from a fresh read of the tree. The statistics / read ratio says what the intervals add to a rebuild.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

from atr_grpo.evaluation.metrics import summarize
from atr_grpo.reporting import stats
from atr_grpo.reporting.analyses import tables
from atr_grpo.reporting.runs import find_runs

MODELS = ("qwen3-1.7b", "qwen3-8b")
METHODS = ("clip", "clip_higher", "dual_clip", "dcpo", "clip_cov", "sapo", "atr")
BENCHMARKS = {"amc23": 40, "aime24": 30, "aime25": 30}
SAMPLES, LAST_STEP, EVERY = 8, 500, 50


def write_run(root: Path, model: str, method: str, seed: int, chars: int, rng: random.Random) -> None:
    path = root / f"table2__{method}__s{seed}__model={model}"
    (path / "eval").mkdir(parents=True)
    config = {
        "experiment": "table2",
        "seed": seed,
        "method": method,
        "model": {"name": model},
        "clipping": {"name": method},
        "trainer": {"max_steps": LAST_STEP},
        "eval": {"benchmarks": list(BENCHMARKS), "k": SAMPLES, "n": SAMPLES, "every_steps": EVERY, "at_start": True},
    }
    OmegaConf.save(OmegaConf.create(config), path / "config.yaml")
    filler = "Let us reason step by step. " * (chars // 28 + 1)
    lines = []
    for step in range(0, LAST_STEP + 1, EVERY):
        for bench, problems in BENCHMARKS.items():
            skill = rng.uniform(0.1, 0.5)
            matrix = [[rng.random() < skill * rng.random() * 2 for _ in range(SAMPLES)] for _ in range(problems)]
            lines.append(
                {
                    "step": step,
                    "benchmark": bench,
                    "num_problems": problems,
                    "n": SAMPLES,
                    **summarize(matrix, ks=[SAMPLES]),
                }
            )
            if step in (0, LAST_STEP):
                records = [
                    {
                        "problem_id": p,
                        "sample": s,
                        "completion": filler[:chars] + f"\\boxed{{{int(c)}}}",
                        "extracted": str(int(c)),
                        "gold": "1",
                        "correct": c,
                        "status": "correct" if c else "wrong",
                        "finish_reason": "stop",
                        "num_tokens": chars // 4,
                    }
                    for p, row in enumerate(matrix)
                    for s, c in enumerate(row)
                ]
                step_dir = path / "eval" / f"step_{step:06d}"
                step_dir.mkdir(exist_ok=True)
                (step_dir / f"{bench}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "eval" / "summary.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def timed(fn: object, repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--chars", type=int, default=4000, help="characters per completion")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    resampling = stats.Resampling(opts.resamples)
    with tempfile.TemporaryDirectory() as tmp:
        rng = random.Random(0)
        for model in MODELS:
            for method in METHODS:
                for seed in range(opts.seeds):
                    write_run(Path(tmp), model, method, seed, opts.chars, rng)
        size = sum(p.stat().st_size for p in Path(tmp).rglob("*.jsonl")) / 2**20

        def read() -> list:
            runs = find_runs(tmp)
            for run in runs:
                for step in (0, LAST_STEP):
                    for bench in BENCHMARKS:
                        run.verdicts(step, bench)
            return runs

        read_s, runs = timed(read, opts.repeat)

        def statistics() -> tables.Table:
            for run in runs:  # keep the files read, score the problems again
                run._cache = {key: value for key, value in run._cache.items() if key[0] == "verdicts"}
            return tables.table2(runs, resampling)  # type: ignore[arg-type]

        stats_s, table = timed(statistics, opts.repeat)
        total_s, _ = timed(lambda: tables.table2(find_runs(tmp), resampling), opts.repeat)
    cells = sum(1 for r in table.rows if r["ci_low"] == r["ci_low"])  # type: ignore[attr-defined]
    tests = sum(1 for r in table.rows if r["p_seeds_vs_clip"] == r["p_seeds_vs_clip"])  # type: ignore[attr-defined]
    print(
        f"tree: {len(MODELS) * len(METHODS) * opts.seeds} runs, {size:.0f} MiB of JSONL; table2: {cells} "
        f"intervals, {tests} tests, {opts.resamples:,} resamples each"
    )
    print(f"read per-sample files  {read_s:7.2f} s")
    print(f"statistics             {stats_s:7.2f} s   ({stats_s / read_s:.2f}× the read)")
    print(f"total (fresh tree)     {total_s:7.2f} s")


if __name__ == "__main__":
    main()
