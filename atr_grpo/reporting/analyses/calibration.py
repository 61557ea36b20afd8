"""Simulated experiments whose truth is known: how often the mark (†) is given to identical methods, how often
it finds a real difference, and how often the intervals cover the truth.

A scenario draws a benchmark of P problems from a population, difficulty p ~ Beta(a, b), and trains S seeds
of methods A_1..A_m and a reference B (m = `comparisons`, usually 1). Every run moves each problem's logit by
run-level random effects, the regime that decides whether a test about the methods can be trusted:
- `shared_sd`: a shift per seed, the same for every method's run of that seed (its start point, its data
  order: the part of the luck that pairing by seed removes);
- `start_problem_sd`: a shift per seed and problem, shared by the seed's methods (what a start point knows);
- `run_sd`: a shift per run, independent between methods (the method × start interaction, which pairing
  cannot remove); the A's have `spread_ratio` times B's SD (methods with unequal spread);
- `collapse`: the probability that a run collapses, its logits moved by `collapse_shift` (a heavy tail).
The endpoint averages `steps` evaluations (1: the final one; more: the AUC). Between evaluations a run's logits
wobble by a stationary AR(1) shift (SD `step_sd`, correlation `step_rho` between consecutive steps). Each
evaluation gives every problem n samples, correct with its probability, read from random numbers that
`stream` draws: `independent` for every run and step, `seed` shared by the methods of a seed (fresh at every
step: common random numbers), or `all`, one draw read by every run at every step (one evaluation seed for the
whole experiment). A problem's score is its Mean@n or unbiased Pass@n (`evaluation.metrics`).

A_1 adds a logit shift chosen so that the true A_1 − B is `effect` standard deviations of the per-seed
differences A_1 − B with that shift in place (`effect_shift`), the SD that the minimum detectable effect is
computed from; the other A's get the shift of no difference (0 unless their spread differs from B's). The
truth is the population's expected score, over problems, run effects and steps, by Monte Carlo.

`calibrate` applies the tables' statistics to many such experiments at once (numpy over a leading axis):
the mark (the exact sign-flip over seeds, Holm over the m comparisons), the paired t over seeds, the
problem-level test and the intervals. `level_held` is the check that a false-mark rate keeps its level.
`scripts/calibrate_stats.py` prints the grid `REGIMES` × problems × seeds; the tests check the rates that matter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from atr_grpo.evaluation.metrics import summarize
from atr_grpo.reporting import stats

TRUTH_DRAWS = 400_000
SPREAD_DATASETS = 400  # null experiments (10 seeds each) that measure the SD of the per-seed differences
CHUNK_DATASETS = 1000  # experiments simulated at once, which bounds the memory of the evaluation streams
STREAMS = ("independent", "seed", "all")
METRICS = ("mean", "pass")
WILSON_Z = 1.96  # the Monte Carlo interval of a rate is Wilson's 95 % interval
LEVEL_TOLERANCE = 2.0  # a false-mark rate keeps its level up to α + 2 Monte Carlo SE of a rate α


@dataclass(frozen=True)
class Scenario:
    problems: int = 30
    samples: int = 8  # n; the metric uses K = n, as the paper's Mean@8 / Pass@8 with 8 samples
    seeds: int = 1
    a: float = 0.5  # Beta(0.5, 2): mean accuracy 0.2, many problems near 0 (AIME-like)
    b: float = 2.0
    shared_sd: float = 0.0  # logit shift per seed, shared by every method's run of that seed
    start_problem_sd: float = 0.0  # logit shift per seed and problem, shared by the seed's methods
    run_sd: float = 0.0  # logit shift per run (B's; the A's have spread_ratio times it)
    spread_ratio: float = 1.0
    collapse: float = 0.0  # probability that a run collapses
    collapse_shift: float = -3.0  # the logit shift of a collapsed run
    steps: int = 1  # evaluations the endpoint averages (the AUC when > 1)
    step_sd: float = 0.0  # SD of a run's logit wobble from one evaluation to the next
    step_rho: float = 0.0  # its correlation between consecutive evaluations
    stream: str = "independent"  # who shares the evaluation's random numbers: one of STREAMS
    comparisons: int = 1  # methods A_1..A_m compared with B in one Holm family
    effect: float = 0.0  # true A_1 − B in SDs of the per-seed differences (0: no method differs)
    metric: str = "mean"  # one of METRICS

    def __post_init__(self) -> None:
        if self.stream not in STREAMS:
            raise ValueError(f"stream must be one of {', '.join(STREAMS)}, got {self.stream!r}")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        for key in ("problems", "samples", "seeds", "steps", "comparisons"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0.0 <= self.step_rho < 1.0:
            raise ValueError(f"step_rho must be in [0, 1), got {self.step_rho}")
        if self.spread_ratio <= 0:
            raise ValueError(f"spread_ratio must be > 0, got {self.spread_ratio}")

    @property
    def metric_name(self) -> str:
        return f"{self.metric}@{self.samples}"


_SMALL = {"shared_sd": 0.1, "run_sd": 0.1}
_AIME = {"shared_sd": 0.3, "run_sd": 0.6}
_AUC = {"steps": 4, "step_sd": 0.2, "step_rho": 0.7}
_START_POINTS = {"shared_sd": 1.0, "start_problem_sd": 0.5, "run_sd": 0.3}
# Run-level random effects from none to the paper's AIME scale (seed SDs of 5–15 points, "A Sober Look at
# Progress in LM Reasoning"); the SD in points each gives is printed by scripts/calibrate_stats.py.
RUN_EFFECTS = {
    "none": {},
    "small": _SMALL,
    "AIME-like": _AIME,
    "collapse": {**_SMALL, "collapse": 0.08},
}
# The features of the CPU power experiment (science review 2, §4–§6): evaluation random numbers shared by the
# methods of a seed, or one stream for every run; the AUC of 4 correlated evaluations read from one stream; a
# Holm family of 3 comparisons with one reference; a rule whose runs spread twice as much; a start point per
# seed; and all of them at once.
DESIGN_FEATURES = {
    "stream per seed": {**_SMALL, "stream": "seed"},
    "one stream": {**_SMALL, "stream": "all"},
    "AUC, 4 steps": {**_SMALL, **_AUC, "stream": "all"},
    "Holm, 3": {**_AIME, "comparisons": 3},
    "unequal spread": {**_AIME, "spread_ratio": 2.0},
    "start points": _START_POINTS,
    "all at once": {**_START_POINTS, **_AUC, "stream": "all", "comparisons": 3, "spread_ratio": 1.5},
}
REGIMES = {**RUN_EFFECTS, **DESIGN_FEATURES}


def regime(name: str, **settings: float | int | str) -> Scenario:
    """The scenario of regime `name` (a key of REGIMES) with other settings."""
    if name not in REGIMES:
        raise ValueError(f"unknown calibration regime {name!r}; the regimes are {', '.join(REGIMES)}")
    return replace(Scenario(), **{**REGIMES[name], **settings})


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p) - np.log1p(-p)


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _normal(rng: np.random.Generator, sd: float, shape: tuple[int, ...]) -> np.ndarray:
    return rng.normal(0.0, sd, shape) if sd > 0 else np.zeros(shape)


def _score_of_count(scenario: Scenario) -> np.ndarray:
    """[n + 1]: the metric of a problem with c = 0..n correct samples, by evaluation.metrics' definitions."""
    n = scenario.samples
    return np.array([summarize([[True] * c + [False] * (n - c)], ks=[n])[scenario.metric_name] for c in range(n + 1)])


def _expected_score(scenario: Scenario, p: np.ndarray) -> np.ndarray:
    return p if scenario.metric == "mean" else 1.0 - (1.0 - p) ** scenario.samples


def _run_effects(scenario: Scenario, sd: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """The logit shift of each run that is its own (SD `sd`, collapse), for runs of shape `shape`."""
    own = _normal(rng, sd, shape)
    if scenario.collapse > 0:
        own = own + scenario.collapse_shift * (rng.random(shape) < scenario.collapse)
    return own


def _step_wobble(scenario: Scenario, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """[steps, *shape]: a stationary AR(1) logit shift per run, SD step_sd, correlation step_rho per step."""
    wobble = [_normal(rng, scenario.step_sd, shape)]
    keep = np.sqrt(1.0 - scenario.step_rho**2)
    for _ in range(1, scenario.steps):
        wobble.append(scenario.step_rho * wobble[-1] + keep * _normal(rng, scenario.step_sd, shape))
    return np.stack(wobble)


def _uniforms(scenario: Scenario, datasets: int, rng: np.random.Generator) -> np.ndarray:
    """[D, S or 1, P, n]: the random numbers of one evaluation, per seed (stream `seed`) or for all runs."""
    seeds = scenario.seeds if scenario.stream == "seed" else 1
    return rng.random((datasets, seeds, scenario.problems, scenario.samples), dtype=np.float32)


def simulate(
    scenario: Scenario, datasets: int, rng: np.random.Generator, shifts: tuple[float, ...] = (0.0,)
) -> np.ndarray:
    """[M, D, S, P] endpoint scores of methods A_1..A_m (logit shifts `shifts`, spread_ratio × B's run SD) and
    B (last, no shift), M = m + 1, on the same problems and start points."""
    shape = (datasets, scenario.seeds, 1)
    logits = _logit(rng.beta(scenario.a, scenario.b, (datasets, 1, scenario.problems)))
    logits = logits + _normal(rng, scenario.shared_sd, shape)
    logits = logits + _normal(rng, scenario.start_problem_sd, (datasets, scenario.seeds, scenario.problems))
    spreads = [scenario.spread_ratio * scenario.run_sd] * len(shifts) + [scenario.run_sd]
    runs = [logits + shift + _run_effects(scenario, sd, shape, rng) for shift, sd in zip((*shifts, 0.0), spreads)]
    wobbles = [_step_wobble(scenario, shape, rng) for _ in runs]
    table = _score_of_count(scenario)
    one_stream = _uniforms(scenario, datasets, rng) if scenario.stream == "all" else None
    scores = np.zeros((len(runs), *logits.shape))
    for step in range(scenario.steps):
        uniforms = _uniforms(scenario, datasets, rng) if scenario.stream == "seed" else one_stream
        for method, (run, wobble) in enumerate(zip(runs, wobbles)):
            probability = _expit(run + wobble[step])
            if uniforms is None:
                counts = rng.binomial(scenario.samples, probability)
            else:
                counts = (uniforms < probability[..., None]).sum(axis=-1)
            scores[method] += table[counts]
    return scores / scenario.steps


def _population(scenario: Scenario, rng: np.random.Generator) -> np.ndarray:
    """[2, TRUTH_DRAWS]: logits of a random problem at a random step of a random run of an A, and of B (the
    same draws, the run effect scaled by spread_ratio for the A)."""
    logits = _logit(rng.beta(scenario.a, scenario.b, TRUTH_DRAWS))
    logits = logits + _normal(rng, scenario.shared_sd, (TRUTH_DRAWS,))
    logits = logits + _normal(rng, scenario.start_problem_sd, (TRUTH_DRAWS,))
    logits = logits + _normal(rng, scenario.step_sd, (TRUTH_DRAWS,))  # the AR(1) shift is stationary
    own = _normal(rng, 1.0, (TRUTH_DRAWS,))  # a run's own shift in units of its SD
    logits = logits + _run_effects(scenario, 0.0, (TRUTH_DRAWS,), rng)  # the collapses alone
    return np.stack([logits + own * scenario.spread_ratio * scenario.run_sd, logits + own * scenario.run_sd])


def true_difference(scenario: Scenario, shift: float, population: np.ndarray) -> float:
    """The population value of A − B when A's logits are shifted by `shift`."""
    shifted, unshifted = _expit(population[0] + shift), _expit(population[1])
    return float((_expected_score(scenario, shifted) - _expected_score(scenario, unshifted)).mean())


def spread_of_differences(scenario: Scenario, shift: float, seed: int) -> float:
    """The SD of the per-seed differences A_1 − B within an experiment (pooled over SPREAD_DATASETS experiments
    of 10 seeds), A_1 shifted by `shift`; the same random numbers for every shift, so that it varies smoothly."""
    a, b = simulate(replace(scenario, seeds=10), SPREAD_DATASETS, np.random.default_rng(seed), (shift,))
    return float(np.sqrt(np.mean(np.var((a - b).mean(axis=-1), axis=-1, ddof=1))))


def effect_shift(scenario: Scenario, population: np.ndarray, seed: int) -> float:
    """The logit shift of A whose true A − B is `scenario.effect` SDs of the per-seed differences (bisection:
    the true difference grows with the shift faster than the SD does); with no effect, the shift that makes
    A's expected score B's although A's runs spread differently."""

    def gap(shift: float) -> float:
        spread = spread_of_differences(scenario, shift, seed) if scenario.effect else 0.0
        return true_difference(scenario, shift, population) - scenario.effect * spread

    low, high = -8.0, 8.0
    if gap(high) < 0 or gap(low) > 0:
        raise ValueError(f"an effect of {scenario.effect} SD is beyond what a logit shift of ±{high} gives")
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if gap(middle) < 0 else (low, middle)
    return (low + high) / 2


SeedTest = Callable[[np.ndarray], np.ndarray]  # per-seed differences [..., S] -> two-sided p [...]


def sign_flip_test(resampling: stats.Resampling) -> SeedTest:
    """The test behind the mark: the exact sign-flip over seeds (stats.seed_sign_flip_pvalue)."""
    return lambda per_seed: stats.seed_sign_flip_pvalue(per_seed, resampling, "calibration|seeds")


def monte_carlo_interval(rate: float, datasets: int) -> tuple[float, float]:
    """Wilson's 95 % interval of a rate measured on `datasets` simulated experiments."""
    centre = (rate + WILSON_Z**2 / (2 * datasets)) / (1 + WILSON_Z**2 / datasets)
    half = WILSON_Z * np.sqrt(rate * (1 - rate) / datasets + WILSON_Z**2 / (4 * datasets**2))
    half /= 1 + WILSON_Z**2 / datasets
    return max(0.0, centre - half), min(1.0, centre + half)


def level_held(rate: float, alpha: float, datasets: int) -> bool:
    """Whether a false-mark rate keeps the level α: at most α + LEVEL_TOLERANCE Monte Carlo SE of a rate α (a
    test at level α exceeds it in about 2 % of calibrations; an anti-conservative one is flagged)."""
    return rate <= alpha + LEVEL_TOLERANCE * np.sqrt(alpha * (1 - alpha) / datasets)


def _marked(pvalues: np.ndarray, alpha: float) -> np.ndarray:
    """[m, D]: which comparisons are marked, Holm-adjusted over the m comparisons of each experiment."""
    if len(pvalues) == 1:
        return pvalues < alpha
    return np.apply_along_axis(stats.holm, 0, pvalues) < alpha


@dataclass(frozen=True)
class Calibration:
    # With no effect, how often any comparison is marked (the family-wise error); with one, how often A_1 − B is.
    marked_rate: float  # of the mark: the seed-level p, Holm over the comparisons, < α
    unadjusted_rate: float  # the same without Holm (equal to marked_rate with one comparison)
    t_rate: float  # of the paired t over the seeds at α, Holm over the comparisons
    problem_rate: float  # of the problem-level sign-flip test of A_1 − B at α (the test about these runs)
    difference_coverage: float  # of the t-interval over the seed differences A_1 − B around the true A_1 − B
    coverage: float  # of A_1's cell interval (crossed bootstrap) around its true value; nan unless asked
    run_sd: float  # SD of B's runs in points (within an experiment)
    difference_sd: float  # SD of the per-seed differences A_1 − B within an experiment, in points
    true_difference: float  # A_1 − B in points
    alpha: float
    datasets: int

    def standard_error(self, rate: float) -> float:
        """The Monte Carlo standard error of a rate measured on `datasets` experiments."""
        return float(np.sqrt(max(rate * (1 - rate), 1e-12) / self.datasets))

    def interval(self, rate: float) -> tuple[float, float]:
        return monte_carlo_interval(rate, self.datasets)

    def level_held(self) -> bool:
        """Whether the false marks keep the level (meaningful with no effect)."""
        return level_held(self.marked_rate, self.alpha, self.datasets)


def calibrate(
    scenario: Scenario,
    datasets: int,
    resampling: stats.Resampling,
    alpha: float,
    seed: int = 0,
    cell_coverage: bool = False,
    seed_test: SeedTest | None = None,
) -> Calibration:
    """Simulate `datasets` experiments of `scenario` (in chunks of CHUNK_DATASETS) and apply the tables'
    statistics to each; `seed_test` replaces the test behind the mark (default: `sign_flip_test`)."""
    seed_test = seed_test or sign_flip_test(resampling)
    rng = np.random.default_rng(seed)
    population = _population(scenario, rng)
    null_shift = effect_shift(replace(scenario, effect=0.0), population, seed) if scenario.spread_ratio != 1 else 0.0
    shift = effect_shift(scenario, population, seed) if scenario.effect else null_shift
    shifts = (shift, *[null_shift] * (scenario.comparisons - 1))
    truth = true_difference(scenario, shift, population)
    true_a = float(_expected_score(scenario, _expit(population[0] + shift)).mean())
    several = scenario.seeds > 1  # the t-test, its interval and a run SD need two seeds
    sums = dict.fromkeys(("marked", "unadjusted", "t", "problem", "covered", "cell", "run_var"), 0.0)
    for start in range(0, datasets, CHUNK_DATASETS):
        scores = simulate(scenario, min(CHUNK_DATASETS, datasets - start), rng, shifts)
        differences = scores[:-1] - scores[-1]  # [m, D, S, P]
        per_seed = differences.mean(axis=-1)  # [m, D, S]: one benchmark, the statistic of each seed pair
        pvalues = seed_test(per_seed)
        t_pvalues = stats.seed_t(per_seed, resampling.confidence)
        counted = slice(0, 1) if scenario.effect else slice(None)  # A_1 alone when it differs, else all
        sums["marked"] += _marked(pvalues, alpha)[counted].any(axis=0).sum()
        sums["unadjusted"] += (pvalues < alpha)[counted].any(axis=0).sum()
        if several:
            sums["t"] += _marked(t_pvalues.p_value, alpha)[counted].any(axis=0).sum()
            sums["covered"] += ((t_pvalues.low[0] <= truth) & (truth <= t_pvalues.high[0])).sum()
            sums["run_var"] += np.var(scores[-1].mean(axis=-1), axis=-1, ddof=1).sum()
        sums["problem"] += (stats.sign_flip_pvalue([differences[0]], resampling, "calibration|problems") < alpha).sum()
        if cell_coverage:
            low, high = stats.interval([scores[0]], resampling, "calibration|a")
            sums["cell"] += ((low <= true_a) & (true_a <= high)).sum()
    rate = {key: float(total) / datasets for key, total in sums.items()}
    return Calibration(
        marked_rate=rate["marked"],
        unadjusted_rate=rate["unadjusted"],
        t_rate=rate["t"] if several else float("nan"),
        problem_rate=rate["problem"],
        difference_coverage=rate["covered"] if several else float("nan"),
        coverage=rate["cell"] if cell_coverage else float("nan"),
        run_sd=100 * float(np.sqrt(rate["run_var"])) if several else float("nan"),
        difference_sd=100 * spread_of_differences(scenario, shift, seed),
        true_difference=100 * truth,
        alpha=alpha,
        datasets=datasets,
    )
