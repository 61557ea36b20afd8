"""Simulated experiments whose truth is known: how often the mark (†) is given to identical methods, how often
it finds a real difference, and how often the intervals cover the truth.

A scenario draws a benchmark of P problems from a population, difficulty p ~ Beta(a, b), and trains S seeds
of two methods A and B. Every run moves each problem's logit by run-level random effects, the regime that
decides whether a test about the methods can be trusted:
- `shared_sd`: a shift per seed, the same for A's and B's run of that seed (same data order, same
  evaluation random numbers: the part of the luck that pairing by seed removes);
- `run_sd`: a shift per run, independent between A and B (the part pairing cannot remove);
- `collapse`: the probability that a run collapses, its logits moved by `collapse_shift` (a heavy tail).
Each problem then gets n samples, correct with its probability; its score is its Mean@n or unbiased Pass@n
(`evaluation.metrics`). Method A adds a logit shift chosen so that the true A − B is `effect` standard
deviations of the per-seed differences A − B with that shift in place (`effect_shift`), the SD that the
minimum detectable effect is computed from. The truth is the population's
expected score, over problems and run effects, by Monte Carlo.

`calibrate` applies the tables' statistics to many such experiments at once (numpy over a leading axis):
the mark (the exact sign-flip over seeds, a family of one), the paired t over seeds, the problem-level test
and the intervals. `scripts/calibrate_stats.py` prints the grid `REGIMES` × problems × seeds; the tests
check the rates that matter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from atr_grpo.evaluation.metrics import summarize
from atr_grpo.reporting import stats

TRUTH_DRAWS = 400_000
SPREAD_DATASETS = 400  # null experiments (10 seeds each) that measure the SD of the per-seed differences


@dataclass(frozen=True)
class Scenario:
    problems: int = 30
    samples: int = 8  # n; the metric uses K = n, as the paper's Mean@8 / Pass@8 with 8 samples
    seeds: int = 1
    a: float = 0.5  # Beta(0.5, 2): mean accuracy 0.2, many problems near 0 (AIME-like)
    b: float = 2.0
    shared_sd: float = 0.0  # logit shift per seed, shared by A's and B's run of that seed
    run_sd: float = 0.0  # logit shift per run
    collapse: float = 0.0  # probability that a run collapses
    collapse_shift: float = -3.0  # the logit shift of a collapsed run
    effect: float = 0.0  # true A − B in SDs of the per-seed differences (0: identical methods)
    metric: str = "mean"  # "mean" or "pass"

    @property
    def metric_name(self) -> str:
        return f"{self.metric}@{self.samples}"


# Run-level random effects from none to the paper's AIME scale (seed SDs of 5–15 points, "A Sober Look at
# Progress in LM Reasoning"); the SD in points each gives is printed by scripts/calibrate_stats.py.
REGIMES = {
    "none": {},
    "small": {"shared_sd": 0.1, "run_sd": 0.1},
    "AIME-like": {"shared_sd": 0.3, "run_sd": 0.6},
    "collapse": {"shared_sd": 0.1, "run_sd": 0.1, "collapse": 0.08},
}


def regime(name: str, **settings: float | int | str) -> Scenario:
    """The scenario of regime `name` (a key of REGIMES) with other settings."""
    return replace(Scenario(), **REGIMES[name], **settings)


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


def _run_effects(scenario: Scenario, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The logit shift of each run that is its own (run_sd, collapse), for runs of shape `shape`."""
    own = rng.normal(0.0, scenario.run_sd, shape) if scenario.run_sd > 0 else np.zeros(shape)
    if scenario.collapse > 0:
        own = own + scenario.collapse_shift * (rng.random(shape) < scenario.collapse)
    return own


def simulate(
    scenario: Scenario, datasets: int, rng: np.random.Generator, shift: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Scores of methods A (logit `shift` over B) and B, each [datasets, seeds, problems], on the same problems."""
    shape = (datasets, scenario.seeds, 1)
    logits = _logit(rng.beta(scenario.a, scenario.b, (datasets, 1, scenario.problems)))
    shared = rng.normal(0.0, scenario.shared_sd, shape) if scenario.shared_sd > 0 else 0.0
    table = _score_of_count(scenario)
    sides = []
    for side_shift in (shift, 0.0):
        run_logits = logits + shared + _run_effects(scenario, shape, rng) + side_shift
        sides.append(table[rng.binomial(scenario.samples, _expit(run_logits))])
    return sides[0], sides[1]


def _population(scenario: Scenario, rng: np.random.Generator) -> np.ndarray:
    """TRUTH_DRAWS logits of a random problem in a random run (run effects included)."""
    logits = _logit(rng.beta(scenario.a, scenario.b, TRUTH_DRAWS))
    shared = rng.normal(0.0, scenario.shared_sd, TRUTH_DRAWS) if scenario.shared_sd > 0 else 0.0
    return logits + shared + _run_effects(scenario, (TRUTH_DRAWS,), rng)


def true_difference(scenario: Scenario, shift: float, population: np.ndarray) -> float:
    """The population value of A − B when A's logits are shifted by `shift`."""
    shifted, unshifted = _expit(population + shift), _expit(population)
    return float((_expected_score(scenario, shifted) - _expected_score(scenario, unshifted)).mean())


def spread_of_differences(scenario: Scenario, shift: float, seed: int) -> float:
    """The SD of the per-seed differences A − B within an experiment (pooled over SPREAD_DATASETS experiments of
    10 seeds), A shifted by `shift`; the same random numbers for every shift, so that it varies smoothly."""
    a, b = simulate(replace(scenario, seeds=10), SPREAD_DATASETS, np.random.default_rng(seed), shift)
    return float(np.sqrt(np.mean(np.var((a - b).mean(axis=-1), axis=-1, ddof=1))))


def effect_shift(scenario: Scenario, population: np.ndarray, seed: int) -> float:
    """The logit shift of A whose true A − B is `scenario.effect` SDs of the per-seed differences (bisection:
    the true difference grows with the shift faster than the SD does)."""

    def gap(shift: float) -> float:
        spread = spread_of_differences(scenario, shift, seed)
        return true_difference(scenario, shift, population) - scenario.effect * spread

    low, high = 0.0, 8.0
    if gap(high) < 0:
        raise ValueError(f"an effect of {scenario.effect} SD is beyond what a logit shift of {high} gives")
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if gap(middle) < 0 else (low, middle)
    return (low + high) / 2


@dataclass(frozen=True)
class Calibration:
    marked_rate: float  # of the mark: the seed-level sign-flip p < α (false marks when effect = 0, else power)
    t_rate: float  # of the paired t over the seeds at α
    problem_rate: float  # of the problem-level sign-flip test at α (the test about these runs)
    difference_coverage: float  # of the t-interval over the seed differences around the true A − B
    coverage: float  # of A's cell interval (crossed bootstrap) around A's true value; nan unless asked
    run_sd: float  # SD of one method's runs in points (within an experiment)
    difference_sd: float  # SD of the per-seed differences A − B within an experiment, in points
    true_difference: float  # in points
    datasets: int

    def standard_error(self, rate: float) -> float:
        """The Monte Carlo standard error of a rate measured on `datasets` experiments."""
        return float(np.sqrt(max(rate * (1 - rate), 1e-12) / self.datasets))


def calibrate(
    scenario: Scenario,
    datasets: int,
    resampling: stats.Resampling,
    alpha: float,
    seed: int = 0,
    cell_coverage: bool = False,
) -> Calibration:
    """Simulate `datasets` experiments of `scenario` and apply the tables' statistics to each."""
    rng = np.random.default_rng(seed)
    population = _population(scenario, rng)
    shift = effect_shift(scenario, population, seed) if scenario.effect else 0.0
    spread = spread_of_differences(scenario, shift, seed)
    a, b = simulate(scenario, datasets, rng, shift)
    truth = true_difference(scenario, shift, population)
    per_seed = stats.seed_means([a - b])  # [datasets, S]
    t_test = stats.seed_t(per_seed, resampling.confidence)
    marked = stats.seed_sign_flip_pvalue(per_seed, resampling, "calibration|seeds") < alpha
    problem_p = stats.sign_flip_pvalue([a - b], resampling, "calibration|problems")
    coverage = float("nan")
    if cell_coverage:
        true_a = float(_expected_score(scenario, _expit(population + shift)).mean())
        low, high = stats.interval([a], resampling, "calibration|a")
        coverage = float(np.mean((low <= true_a) & (true_a <= high)))
    several = scenario.seeds > 1  # the t-test, its interval and a run SD need two seeds
    run_sd = np.sqrt(np.mean(np.var(b.mean(axis=-1), axis=-1, ddof=1))) if several else np.nan
    covered = (t_test.low <= truth) & (truth <= t_test.high)
    return Calibration(
        marked_rate=float(np.mean(marked)),
        t_rate=float(np.mean(t_test.p_value < alpha)) if several else float("nan"),
        problem_rate=float(np.mean(problem_p < alpha)),
        difference_coverage=float(np.mean(covered)) if several else float("nan"),
        coverage=coverage,
        run_sd=100 * float(run_sd),
        difference_sd=100 * spread,
        true_difference=100 * truth,
        datasets=datasets,
    )
