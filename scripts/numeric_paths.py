"""Does a CPU result hang on float noise? Run it on several numeric paths (`atr_grpo.numeric_paths`) and tabulate.

    python scripts/numeric_paths.py demo  --out DIR                    # the demo, native/avx2/baseline × seeds 0-4
    python scripts/numeric_paths.py start --out DIR --recipe demo --epochs 3 6 9 --paths native avx2
                                                                       # SFT + step-0 Mean@8, sft.seed 0-4
    python scripts/numeric_paths.py demo  --out DIR --paths baseline --seeds 1 --set trainer.learning_rate=1e-4

Each path runs in processes of its own, with a cache of its own under `--out`, so it builds its own tiny base model
and SFT adapter: the whole pipeline runs on that path. A finished run is read again, never re-run.
`demo` gives Mean@8 and Pass@8 before and after GRPO, and the truncated samples after. `start` gives the step-0
Mean@8 of the recipe's SFT adapter for each SFT budget (`sft.num_epochs`) and SFT seed: where it has stopped
moving with the budget, float noise moves it little. The table goes to `--out/<mode>.md` and is printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from atr_grpo import run_environment, rundir  # noqa: E402
from atr_grpo.numeric_paths import NUMERIC_PATHS, path_environment  # noqa: E402
from atr_grpo.rundir import records  # noqa: E402

K = 8


class RunFailed(Exception):
    """A run's process failed; its status is this script's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def run_once(out: Path, path: str, name: str, overrides: list[str]) -> list[dict]:
    """One training run on `path` into out/path/name (skipped when it finished); its summary rows, by step."""
    run_dir = out / path / name
    if not (run_dir / "DONE").exists():
        env = path_environment(path)
        env["ATR_GRPO_CACHE"] = str((out / path / "cache").resolve())
        started = time.time()
        command = [sys.executable, "-m", "atr_grpo.train", f"run_dir={run_dir.resolve()}", *overrides]
        status = subprocess.run(command, env=env, cwd=REPO).returncode
        if status != 0:  # the run printed why (a refusal is one line): say which run, no traceback of ours
            raise RunFailed(status, f"{path} {name}: `python -m atr_grpo.train` exited with status {status} (above)")
        print(f"{path} {name}: {time.time() - started:.0f} s", flush=True)
    rows = records.summary_lines(rundir.summary_path(run_dir))
    return sorted((r for r in rows if r["benchmark"] == "arithmetic"), key=lambda r: r["step"])


def percent(row: dict, metric: str) -> float:
    return 100 * row[f"{metric}@{K}"]


def demo_table(args: argparse.Namespace) -> str:
    lines = [
        f"| path | seed | Mean@{K} before | after | Pass@{K} before | after | truncated after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    gains = []
    for path in args.paths:
        for seed in args.seeds:
            rows = run_once(args.out, path, f"demo-s{seed}", ["experiment=demo", f"seed={seed}", *args.overrides])
            first, last = rows[0], rows[-1]
            counts = last["status_counts"]
            gains.append(percent(last, "mean") - percent(first, "mean"))
            lines.append(
                f"| {path} | {seed} | {percent(first, 'mean'):.1f} % | {percent(last, 'mean'):.1f} % | "
                f"{percent(first, 'pass'):.1f} % | {percent(last, 'pass'):.1f} % | "
                f"{counts['truncated']} / {sum(counts.values())} |"
            )
    improved = sum(gain > 0 for gain in gains)
    lines += [
        "",
        f"Mean@{K} after > before in {improved} of {len(gains)} runs; gain in points: min {min(gains):+.1f}, "
        f"median {statistics.median(gains):+.1f}, max {max(gains):+.1f}.",
    ]
    return "\n".join(lines)


def start_table(args: argparse.Namespace) -> str:
    seeds = " ".join(f"s{s}" for s in args.seeds)
    lines = [f"| path | SFT epochs | step-0 Mean@{K}, {seeds} | mean | SD | range |", "|---|---:|---|---:|---:|---:|"]
    for path in args.paths:
        for epochs in args.epochs:
            scores = []
            for seed in args.seeds:
                overrides = [f"experiment={args.recipe}", f"sft.seed={seed}", f"sft.num_epochs={epochs}"]
                overrides += ["trainer.max_steps=1", "eval.every_steps=1", "eval.share_start=false", *args.overrides]
                rows = run_once(args.out, path, f"{args.recipe}-e{epochs}-s{seed}", overrides)
                scores.append(percent(rows[0], "mean"))
            spread = statistics.stdev(scores) if len(scores) > 1 else float("nan")
            lines.append(
                f"| {path} | {epochs} | {', '.join(f'{s:.1f}' for s in scores)} | {statistics.mean(scores):.1f} | "
                f"{spread:.1f} | {max(scores) - min(scores):.1f} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["demo", "start"])
    parser.add_argument("--out", type=Path, required=True, help="a folder for the runs, their caches and the table")
    parser.add_argument("--paths", nargs="+", default=list(NUMERIC_PATHS), choices=list(NUMERIC_PATHS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--recipe", default="demo", help="start: the experiment whose SFT stage is studied")
    parser.add_argument("--epochs", nargs="+", type=int, default=[3], help="start: the SFT budgets (sft.num_epochs)")
    parser.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides")
    args = parser.parse_args()
    try:
        body = demo_table(args) if args.mode == "demo" else start_table(args)
    except RunFailed as err:
        print(f"stopped: {err}", file=sys.stderr)
        return err.status
    text = (
        f"Host: {run_environment.cpu_model()}; `python scripts/numeric_paths.py {' '.join(sys.argv[1:])}`\n\n{body}\n"
    )
    (args.out / f"{args.mode}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
