"""Does the demo's outcome hang on float noise? `make demo` once per (numeric path, seed), and a table of the results.

    python scripts/demo_paths.py --out results/demo_paths                     # native, avx2, baseline × seeds 0-4
    python scripts/demo_paths.py --out DIR --paths native --seeds 0 1 -- trainer.max_steps=50

Each numeric path (`atr_grpo.numeric_paths`) runs in processes of its own, with a cache of its own under `--out`, so
it builds its own tiny base model and SFT adapter: the whole pipeline runs on that path. A finished run is read
again, never re-run. Writes `--out/table.md` (Mean@8 and Pass@8 before and after GRPO, and the truncated samples
after) and prints it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from atr_grpo import rundir  # noqa: E402
from atr_grpo.numeric_paths import NUMERIC_PATHS, path_environment  # noqa: E402

BENCH, K = "arithmetic", 8


def run_once(out: Path, path: str, seed: int, overrides: list[str]) -> Path:
    """One demo run on `path` (skipped when its evaluations are all written); returns its run directory."""
    run_dir = out / path / f"s{seed}"
    done = rundir.summary_path(run_dir)
    if done.exists() and any(r.get("step", 0) > 0 for r in rundir.read_jsonl(done)):
        return run_dir
    env = path_environment(path)
    env["ATR_GRPO_CACHE"] = str((out / path / "cache").resolve())
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # share the cores politely with other jobs
    command = [sys.executable, "-m", "atr_grpo.train", "experiment=demo", f"seed={seed}", f"run_dir={run_dir}"]
    started = time.time()
    subprocess.run([*command, *overrides], env=env, cwd=REPO, check=True)
    print(f"{path} seed {seed}: {time.time() - started:.0f} s", flush=True)
    return run_dir


def outcome(run_dir: Path) -> dict[str, float]:
    rows = sorted(
        (r for r in rundir.read_jsonl(rundir.summary_path(run_dir)) if r["benchmark"] == BENCH), key=lambda r: r["step"]
    )
    first, last = rows[0], rows[-1]
    counts = last.get("status_counts", {})
    return {
        "before": 100 * first[f"mean@{K}"],
        "after": 100 * last[f"mean@{K}"],
        "pass_before": 100 * first[f"pass@{K}"],
        "pass_after": 100 * last[f"pass@{K}"],
        "truncated": counts.get("truncated", float("nan")),
        "samples": sum(counts.values()) if counts else float("nan"),
        "step": last["step"],
    }


def table(results: dict[tuple[str, int], dict[str, float]]) -> str:
    lines = [
        f"| path | seed | Mean@{K} before | after | Pass@{K} before | after | truncated after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (path, seed), r in sorted(
        results.items(), key=lambda item: (list(NUMERIC_PATHS).index(item[0][0]), item[0][1])
    ):
        lines.append(
            f"| {path} | {seed} | {r['before']:.1f} % | {r['after']:.1f} % | {r['pass_before']:.1f} % | "
            f"{r['pass_after']:.1f} % | {r['truncated']:.0f} / {r['samples']:.0f} |"
        )
    gains = [r["after"] - r["before"] for r in results.values()]
    improved = sum(gain > 0 for gain in gains)
    lines.append("")
    lines.append(
        f"Mean@{K} after > before in {improved} of {len(gains)} runs; gain min {min(gains):+.1f}, "
        f"median {statistics.median(gains):+.1f}, max {max(gains):+.1f} points."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="a folder for the runs, their caches and table.md")
    parser.add_argument("--paths", nargs="+", default=list(NUMERIC_PATHS), choices=list(NUMERIC_PATHS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("overrides", nargs="*", help="config overrides for every run (after --)")
    args = parser.parse_args()
    results = {}
    for path in args.paths:
        for seed in args.seeds:
            results[(path, seed)] = outcome(run_once(args.out, path, seed, args.overrides))
    host = rundir.cpu_model()
    text = f"Host: {host}; `{' '.join(sys.argv)}`\n\n{table(results)}\n"
    (args.out / "table.md").write_text(text)
    print(text)
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
