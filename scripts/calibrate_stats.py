"""False marks and power of the tables' statistics on simulated experiments whose truth is known.

    python scripts/calibrate_stats.py [--datasets D] [--resamples R] [--alpha A] [--effect E] [--cell-coverage]

For each run-level regime (atr_grpo/reporting/calibration.py, REGIMES: no run effects, small ones, AIME-like
ones, a collapse mixture), 30 and 128 problems and 3 and 10 seeds, D experiments with identical methods and D
with a true A − B of E standard deviations of the per-seed differences are drawn (8 samples per problem,
Mean@8). The table prints the SD of one method's runs and of the per-seed differences (points), then:
- false marks: how often † (the exact sign-flip test over seeds, a family of one) marks identical methods;
- power: how often it marks the real difference (the paired t-test over seeds beside it);
- the paired t's rate on identical methods and the coverage of its interval of A − B;
- how often the problem-level test (about these runs, not the methods) rejects identical methods.
"""

from __future__ import annotations

import argparse
import time

from atr_grpo.reporting.calibration import REGIMES, calibrate, regime
from atr_grpo.reporting.stats import Resampling

PROBLEMS = (30, 128)
SEEDS = (3, 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=2000, help="simulated experiments per row and effect")
    parser.add_argument("--resamples", type=int, default=2000, help="problem-level sign flips (and bootstrap)")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--effect", type=float, default=1.0, help="the real effect, in SDs of per-seed differences")
    parser.add_argument("--cell-coverage", action="store_true", help="also the coverage of a cell's interval (slow)")
    opts = parser.parse_args()
    resampling = Resampling(opts.resamples, confidence=1 - opts.alpha)
    started = time.perf_counter()
    print(
        f"{opts.datasets:,} simulated experiments per row and effect (Beta(0.5, 2) problems, 8 samples, Mean@8), "
        f"alpha {opts.alpha:g}; power at a true A − B of {opts.effect:g} SD of the per-seed differences\n"
    )
    cell = " cell CI coverage |" if opts.cell_coverage else ""
    print(
        f"| run effects | problems | seeds | run SD (pt) | SD of differences (pt) | false marks (†) | power (†) "
        f"| paired t: false / power | t-interval coverage | problem-level test: false |{cell}"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|" + "---:|" * opts.cell_coverage)
    for name in REGIMES:
        for problems in PROBLEMS:
            for seeds in SEEDS:
                null = calibrate(
                    regime(name, problems=problems, seeds=seeds),
                    opts.datasets,
                    resampling,
                    opts.alpha,
                    cell_coverage=opts.cell_coverage,
                )
                real = calibrate(
                    regime(name, problems=problems, seeds=seeds, effect=opts.effect),
                    opts.datasets,
                    resampling,
                    opts.alpha,
                    seed=1,
                )
                extra = f" {null.coverage:.3f} |" if opts.cell_coverage else ""
                print(
                    f"| {name} | {problems} | {seeds} | {null.run_sd:.2f} | {null.difference_sd:.2f} "
                    f"| {null.marked_rate:.3f} | {real.marked_rate:.3f} | {null.t_rate:.3f} / {real.t_rate:.3f} "
                    f"| {null.difference_coverage:.3f} | {null.problem_rate:.3f} |{extra}"
                )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
