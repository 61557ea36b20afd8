"""What the intervals and the test deliver on simulated benchmarks whose truth is known.

    python scripts/calibrate_stats.py [--datasets D] [--resamples R] [--alpha A]

For each scenario (atr_grpo/reporting/calibration.py: problems from a Beta population, a logit shift per
training seed, 8 samples per problem), D benchmarks are drawn and the table prints: how often the interval of
one method's value covers its population value, how often the paired interval of A − B covers the true
difference, how often the sign-flip test rejects at α, and how often the tables' mark (†) is given. With
shift 0 the last two are false-positive rates.
"""

from __future__ import annotations

import argparse

from atr_grpo.reporting.calibration import Scenario, calibrate
from atr_grpo.reporting.stats import Resampling

SCENARIOS = [
    Scenario(),
    Scenario(metric="pass"),
    Scenario(problems=40, a=2.0, b=2.0),
    Scenario(a=0.3, b=3.0),
    Scenario(seeds=3),
    Scenario(seed_sd=0.3),
    Scenario(seeds=3, seed_sd=0.3),
    Scenario(seeds=3, seed_sd=0.5),
    Scenario(seeds=5, seed_sd=0.3),
    Scenario(shift=0.5),
    Scenario(seeds=3, seed_sd=0.3, shift=0.5),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=2000)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--alpha", type=float, default=0.05)
    opts = parser.parse_args()
    resampling = Resampling(opts.resamples, confidence=1 - opts.alpha)
    print(f"{opts.datasets} simulated benchmarks per row, {opts.resamples} resamples, alpha {opts.alpha:g}\n")
    print("| problems | Beta(a, b) | metric | seeds | seed sd (logit) | shift (logit) | coverage | A − B coverage "
          "| test rejects | marked |")  # fmt: skip
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for scenario in SCENARIOS:
        found = calibrate(scenario, opts.datasets, resampling, opts.alpha)
        print(f"| {scenario.problems} | ({scenario.a:g}, {scenario.b:g}) | {scenario.metric_name} | {scenario.seeds} "
              f"| {scenario.seed_sd:g} | {scenario.shift:g} | {found.coverage:.3f} | {found.difference_coverage:.3f} "
              f"| {found.rejection_rate:.3f} | {found.marked_rate:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
