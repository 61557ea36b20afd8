"""False marks and power of the tables' statistics on simulated experiments whose truth is known.

    python scripts/calibrate_stats.py [--datasets D] [--resamples R] [--alpha A] [--effect E] [--cell-coverage]

Each row of the table simulates D experiments with no method difference and D with a true A − B of E standard
deviations of the per-seed differences (8 samples per problem, Mean@8), in one regime of
atr_grpo/reporting/analyses/calibration.py: the run-level effects (none, small, AIME-like, a collapse mixture) at 30
and 128 problems and 3 and 10 seeds, then the features of the power experiment (shared evaluation streams, the
AUC over correlated steps, a Holm family of 3, unequal spread, start points, all at once) at 30 problems and
10 seeds. The table prints the SD of one method's runs and of the per-seed differences (points), then:
- false marks: how often † (the exact sign-flip test over seeds, Holm over the family) marks a comparison
  whose methods do not differ (any of them: the family-wise error), with Wilson's 95 % Monte Carlo interval,
  and whether that keeps the level α (at most α + 2 Monte Carlo SE, `calibration.level_held`);
- power: how often † marks the real difference (the paired t-test over seeds beside it, Holm-adjusted alike);
- the coverage of the paired t-interval of A − B around the true A − B, with no effect and with the effect;
- how often the problem-level test (about these runs, not the methods) rejects when the methods do not differ.
"""

from __future__ import annotations

import argparse
import itertools
import time

from atr_grpo.reporting.analyses.calibration import DESIGN_FEATURES, RUN_EFFECTS, calibrate, regime
from atr_grpo.reporting.stats import Resampling

PROBLEMS = (30, 128)
SEEDS = (3, 10)
DESIGN = ((30, 10),)  # problems and seeds of the design-feature regimes (10 seeds: the power experiment's)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=10_000, help="simulated experiments per row and effect")
    parser.add_argument("--resamples", type=int, default=2000, help="problem-level sign flips (and bootstrap)")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--effect", type=float, default=1.0, help="the real effect, in SDs of per-seed differences")
    parser.add_argument("--cell-coverage", action="store_true", help="also the coverage of a cell's interval (slow)")
    opts = parser.parse_args()
    if opts.datasets < 1:
        parser.error(f"--datasets must be >= 1, got {opts.datasets}")
    resampling = Resampling(opts.resamples, confidence=1 - opts.alpha)
    started = time.perf_counter()
    print(
        f"{opts.datasets:,} simulated experiments per row and effect (Beta(0.5, 2) problems, 8 samples, Mean@8); "
        f"power at a true A − B of {opts.effect:g} SD of the per-seed differences\n"
    )
    cell = " cell CI coverage |" if opts.cell_coverage else ""
    print(
        "| regime | problems | seeds | α | run SD (pt) | SD of differences (pt) | false marks (†), % [95 % MC] "
        "| level held | power (†) | paired t: false / power | t-interval coverage: null / effect "
        f"| problem-level test: false |{cell}"
    )
    print("|---|---:|---:|---:|---:|---:|---|---|---:|---|---|---:|" + "---:|" * opts.cell_coverage)
    rows = [(name, grid) for name in RUN_EFFECTS for grid in itertools.product(PROBLEMS, SEEDS)]
    rows += [(name, grid) for name in DESIGN_FEATURES for grid in DESIGN]
    for name, (problems, seeds) in rows:
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
        low, high = null.interval(null.marked_rate)
        held = "yes" if null.level_held() else "NO"
        extra = f" {null.coverage:.3f} |" if opts.cell_coverage else ""
        print(
            f"| {name} | {problems} | {seeds} | {opts.alpha:g} | {null.run_sd:.2f} | {null.difference_sd:.2f} "
            f"| {100 * null.marked_rate:.2f} [{100 * low:.2f}, {100 * high:.2f}] | {held} "
            f"| {real.marked_rate:.3f} | {null.t_rate:.3f} / {real.t_rate:.3f} "
            f"| {null.difference_coverage:.3f} / {real.difference_coverage:.3f} | {null.problem_rate:.3f} |{extra}",
            flush=True,
        )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
