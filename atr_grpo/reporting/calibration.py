"""Simulated evaluations whose truth is known: how often the intervals cover it, how often the test errs.

A scenario draws a benchmark of P problems from a population, difficulty p ~ Beta(a, b); a training seed
shifts every problem's logit by u ~ N(0, seed_sd) (its luck, shared by all problems of that run); method A
adds `shift` to B's logits; each problem gets n samples, correct with its probability. The score of a problem
is its Mean@n or unbiased Pass@n (`evaluation.metrics` on a row with c correct samples); the truth is the
population's expected score, E[p'] or E[1 − (1 − p')^n] over problems and seeds, by Monte Carlo.

`scripts/calibrate_stats.py` prints these figures for a grid of scenarios; the tests check a few of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atr_grpo.evaluation.metrics import summarize
from atr_grpo.reporting import stats

TRUTH_DRAWS = 1_000_000


@dataclass(frozen=True)
class Scenario:
    problems: int = 30
    samples: int = 8  # n; the metric uses K = n, as the paper's Mean@8 / Pass@8 with 8 samples
    seeds: int = 1
    a: float = 0.5  # Beta(0.5, 2): mean accuracy 0.2, many problems near 0 (AIME-like)
    b: float = 2.0
    seed_sd: float = 0.0  # spread of the seed's logit shift
    shift: float = 0.0  # method A's logit shift over B (0: identical methods)
    metric: str = "mean"  # "mean" or "pass"

    @property
    def metric_name(self) -> str:
        return f"{self.metric}@{self.samples}"


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p) - np.log1p(-p)


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _score_of_count(scenario: Scenario) -> np.ndarray:
    """[n + 1]: the metric of a problem with c = 0..n correct samples, by evaluation.metrics' definitions."""
    n = scenario.samples
    return np.array([summarize([[True] * c + [False] * (n - c)], ks=[n])[scenario.metric_name] for c in range(n + 1)])


def _expected_score(scenario: Scenario, p: np.ndarray) -> np.ndarray:
    return p if scenario.metric == "mean" else 1.0 - (1.0 - p) ** scenario.samples


def truth(scenario: Scenario, shift: float, rng: np.random.Generator) -> float:
    """The population value of the metric for a method with logit `shift`."""
    p = rng.beta(scenario.a, scenario.b, TRUTH_DRAWS)
    u = rng.normal(0.0, scenario.seed_sd, TRUTH_DRAWS) if scenario.seed_sd > 0 else 0.0
    return float(_expected_score(scenario, _expit(_logit(p) + shift + u)).mean())


def simulate(scenario: Scenario, datasets: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Scores of methods A and B, each [datasets, seeds, problems], on the same problems."""
    logits = _logit(rng.beta(scenario.a, scenario.b, (datasets, 1, scenario.problems)))
    table = _score_of_count(scenario)
    sides = []
    for shift in (scenario.shift, 0.0):
        luck = rng.normal(0.0, scenario.seed_sd, (datasets, scenario.seeds, 1))  # every run samples afresh
        correct = rng.binomial(scenario.samples, _expit(logits + shift + luck))
        sides.append(table[correct])
    return sides[0], sides[1]


@dataclass(frozen=True)
class Calibration:
    coverage: float  # of A's interval around A's true value
    difference_coverage: float  # of the paired interval of A − B around the true difference
    rejection_rate: float  # of the sign-flip test at `alpha` (a false-positive rate when shift = 0)
    marked_rate: float  # of the tables' mark: the test rejects and the paired interval excludes 0
    datasets: int


def calibrate(scenario: Scenario, datasets: int, resampling: stats.Resampling, alpha: float,
              seed: int = 0) -> Calibration:  # fmt: skip
    """Draw `datasets` benchmarks and measure the interval coverage and the test's rejection rate."""
    rng = np.random.default_rng(seed)
    a, b = simulate(scenario, datasets, rng)
    true_a, true_b = truth(scenario, scenario.shift, rng), truth(scenario, 0.0, rng)
    low, high = stats.interval([a], resampling, "calibration|a")
    d_low, d_high = stats.interval([a - b], resampling, "calibration|difference")
    p_values = stats.sign_flip_pvalue([a - b], resampling, "calibration|sign-flip")
    diff, rejected = true_a - true_b, p_values < alpha
    return Calibration(coverage=float(np.mean((low <= true_a) & (true_a <= high))),
                       difference_coverage=float(np.mean((d_low <= diff) & (diff <= d_high))),
                       rejection_rate=float(np.mean(rejected)),
                       marked_rate=float(np.mean(rejected & ((d_low > 0) | (d_high < 0)))),
                       datasets=datasets)  # fmt: skip
