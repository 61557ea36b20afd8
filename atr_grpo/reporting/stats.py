"""Bootstrap intervals, seed-level and problem-level paired tests, robust summaries over runs (numpy, vectorised).

The unit of data is a score array `[..., S, P]` per benchmark: S seeds (runs) × P problems, each entry a
problem's Mean@K or unbiased Pass@K in [0, 1]; leading axes are independent data sets (used by the
calibration). The statistic is always the same: the mean over benchmarks of the mean over seeds and problems,
which is how the tables compute a cell and the paper's Average.

- **Interval**: a percentile bootstrap. Problems are resampled with replacement, independently per benchmark
  (the Average is stratified by benchmark); when a cell pools S ≥ 2 seeds, the seeds are resampled too, one
  draw shared by every problem and benchmark (seeds and problems are crossed, not nested: a two-way or
  "pigeonhole" bootstrap, Owen 2007). With one seed the interval holds problem and sampling noise only, not
  the training-seed spread. Problems are drawn as index arrays (one gather per chunk of resamples), seeds as
  weights (how often each seed was drawn), so no Python loop runs per resample.
- **The seed-level test** (the one that decides the mark): the run is the unit. Each seed pair gives one
  difference (`seed_means`: the statistic above for that pair alone), and under "A and B are the same method"
  each difference is as likely to be +d as −d. `seed_sign_flip_pvalue` enumerates all 2^S sign patterns (exact;
  a random sample of R patterns above `EXACT_SEEDS` seeds), so its p cannot go below 2^(1−S) (0.25 with 3
  seeds): `smallest_seed_pvalue` says so wherever a p is shown. `seed_t` gives the paired t-test beside it and
  the t-interval over the seed differences (which keeps its coverage with few seeds, unlike a bootstrap over 3
  seeds), `minimum_detectable_effect` the effect that 80 % power needs at that spread, at the level the
  comparison's test uses (`holm_level` for a member of a Holm family), and `paired_t_power` the power to detect
  a given difference (the observed one, beside a difference that is not significant).
- **Equivalence** (`seed_tost`): a "no difference" claim needs the paired TOST over the per-seed differences
  with a margin fixed before the runs (the analysis plan, `reporting.plan`); without it, "not established".
- **The problem-level test** (secondary, `sign_flip_pvalue`): the seed-averaged difference of each problem is
  flipped instead. It asks whether these particular runs differ beyond evaluation noise; a difference that comes
  from the training seed counts as real for it, so it says nothing about the methods.
- **Robust summaries over runs** as rliable defines them (Agarwal et al. 2021): the interquartile mean
  (`interquartile_mean`) and the probability of improvement P(A > B) over all pairs of runs, averaged over the
  benchmarks, with a bootstrap interval over runs (`improvement_interval`).
- **Holm** step-down adjustment for a family of p-values; **the mark** (`significant`) is the Holm-adjusted
  seed-level p below α. (`scripts/calibrate_stats.py` measures its false marks and power on simulated runs.)

Every random draw comes from `Resampling.generator(key)`: a fixed seed and the name of what is resampled, so
a rebuild is byte-identical and one cell's draw does not depend on which other cells exist.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats


@dataclass(frozen=True)
class Resampling:
    resamples: int = 10_000
    seed: int = 0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100, got {self.resamples}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")

    def generator(self, key: str) -> np.random.Generator:
        """The random stream for `key` (e.g. the cell's model, method and metric)."""
        return np.random.default_rng([self.seed, zlib.crc32(key.encode("utf-8"))])

    def describe(self) -> str:
        level = f"{100 * self.confidence:g}%"
        return (
            f"{level} percentile bootstrap over problems (and over seeds when a cell has several), "
            f"{self.resamples:,} resamples, seed {self.seed}"
        )


def _check(scores: Sequence[np.ndarray]) -> int:
    """The common number of seeds S of per-benchmark arrays [..., S, P_b]."""
    if not scores:
        raise ValueError("no benchmarks to resample")
    seeds = {a.shape[-2] for a in scores}
    if len(seeds) != 1 or min(a.shape[-1] for a in scores) < 1:
        shapes = [a.shape for a in scores]
        raise ValueError(f"every benchmark needs the same seeds and >= 1 problem, got shapes {shapes}")
    return seeds.pop()


CHUNK_ELEMENTS = 4_000_000  # bound on the gathered array of one step of `_resampled_means`


def _resampled_means(scores: np.ndarray, problem_draws: np.ndarray, seed_weights: np.ndarray) -> np.ndarray:
    """[..., R]: for each resample r, the mean over problems `problem_draws[r]` ([R, P] indices), weighted over
    seeds by `seed_weights[r]` ([R, S], how often each seed was drawn, divided by S); in chunks of resamples."""
    draws = problem_draws.shape[0]
    chunk = max(1, CHUNK_ELEMENTS // scores.size)
    parts = []
    for start in range(0, draws, chunk):
        means = scores[..., problem_draws[start : start + chunk]].mean(axis=-1)  # [..., S, r]
        parts.append(np.einsum("rs,...sr->...r", seed_weights[start : start + chunk], means))
    return np.concatenate(parts, axis=-1)


def estimate(scores: Sequence[np.ndarray]) -> np.ndarray:
    """Mean over benchmarks of the mean over seeds and problems: [...]."""
    _check(scores)
    return np.mean([a.mean(axis=(-2, -1)) for a in scores], axis=0)


def replicates(scores: Sequence[np.ndarray], resampling: Resampling, key: str) -> np.ndarray:
    """Bootstrap replicates [..., R] of `estimate(scores)` (seeds and problems crossed, see the module doc)."""
    n_seeds, draws = _check(scores), resampling.resamples
    rng = resampling.generator(key)
    seed_draws = rng.integers(0, n_seeds, (draws, n_seeds))  # one seed draw, shared by every benchmark
    seed_weights = (seed_draws[:, :, None] == np.arange(n_seeds)).mean(axis=1)  # [R, S]
    per_bench = [_resampled_means(a, rng.integers(0, a.shape[-1], (draws, a.shape[-1])), seed_weights) for a in scores]
    return np.mean(per_bench, axis=0)


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The (1 − confidence)/2 and (1 + confidence)/2 quantiles of the replicates along the last axis."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail], axis=-1)
    return low, high


def interval(scores: Sequence[np.ndarray], resampling: Resampling, key: str) -> tuple[np.ndarray, np.ndarray]:
    return percentile_interval(replicates(scores, resampling, key), resampling.confidence)


def sign_flip_pvalue(differences: Sequence[np.ndarray], resampling: Resampling, key: str) -> np.ndarray:
    """Two-sided p-value [...] of "mean difference = 0" for paired differences [..., S, P_b] per benchmark."""
    _check(differences)
    rng = resampling.generator(key)
    per_problem = [d.mean(axis=-2) for d in differences]  # [..., P_b]: seeds of a problem flip together
    observed = np.mean([d.mean(axis=-1) for d in per_problem], axis=0)
    flipped = []
    for d in per_problem:
        signs = rng.integers(0, 2, size=(resampling.resamples, d.shape[-1])) * 2.0 - 1.0  # [R, P_b]
        flipped.append(np.einsum("rp,...p->...r", signs, d) / d.shape[-1])
    null = np.mean(flipped, axis=0)  # [..., R]
    tolerance = 1e-12  # flips that reproduce |T| up to rounding count as at least as extreme
    extreme = (np.abs(null) >= np.abs(observed)[..., None] - tolerance).sum(axis=-1)
    return (1.0 + extreme) / (1.0 + resampling.resamples)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: family-wise error ≤ α when the adjusted p-values are compared with α."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [1.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


# ------------------------------------------------------------------------------------ the run as the unit
EXACT_SEEDS = 16  # up to 2^16 sign patterns are enumerated; above, R random patterns are drawn
ROUNDING = 1e-12  # flips that reproduce |T| up to rounding count as at least as extreme


def seed_means(differences: Sequence[np.ndarray]) -> np.ndarray:
    """[..., S]: the statistic of each seed (run pair) alone, from arrays [..., S, P_b] per benchmark."""
    _check(differences)
    return np.mean([d.mean(axis=-1) for d in differences], axis=0)


def _seed_patterns(n_seeds: int, resampling: Resampling, key: str) -> tuple[np.ndarray, bool]:
    """([N, S] signs ±1, exact): every pattern when S <= EXACT_SEEDS, else R random ones from `key`'s stream."""
    if n_seeds <= EXACT_SEEDS:
        bits = (np.arange(2**n_seeds)[:, None] >> np.arange(n_seeds)) & 1
        return 1.0 - 2.0 * bits, True
    rng = resampling.generator(key)
    return rng.integers(0, 2, size=(resampling.resamples, n_seeds)) * 2.0 - 1.0, False


def seed_sign_flip_pvalue(per_seed: np.ndarray, resampling: Resampling, key: str) -> np.ndarray:
    """Two-sided p [...] of "mean difference = 0" for per-seed differences [..., S]: the share of sign patterns
    whose |mean| reaches the observed one (exact), or (1 + #) / (1 + R) when R patterns are drawn."""
    n_seeds = per_seed.shape[-1]
    signs, exact = _seed_patterns(n_seeds, resampling, key)
    observed = np.abs(per_seed.mean(axis=-1))
    null = np.abs(per_seed @ signs.T) / n_seeds  # [..., N]
    extreme = (null >= observed[..., None] - ROUNDING).sum(axis=-1)
    return extreme / len(signs) if exact else (1.0 + extreme) / (1.0 + len(signs))


def seed_test_is_exact(n_seeds: int) -> bool:
    return n_seeds <= EXACT_SEEDS


def smallest_seed_pvalue(n_seeds: int, resampling: Resampling) -> float:
    """The smallest p `seed_sign_flip_pvalue` can give with S seeds: 2 of 2^S patterns, or 1 / (R + 1)."""
    return 2.0 ** (1 - n_seeds) if seed_test_is_exact(n_seeds) else 1.0 / (resampling.resamples + 1)


@dataclass(frozen=True)
class SeedT:
    """The paired t-test and t-interval over S per-seed differences (df = S − 1); nan with one seed."""

    p_value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    sd: np.ndarray  # sample SD (ddof 1) of the per-seed differences


def seed_t(per_seed: np.ndarray, confidence: float) -> SeedT:
    n_seeds = per_seed.shape[-1]
    if n_seeds < 2:
        nan = np.full(per_seed.shape[:-1], np.nan)
        return SeedT(nan, nan, nan, nan)
    mean, sd = per_seed.mean(axis=-1), per_seed.std(axis=-1, ddof=1)
    error = sd / np.sqrt(n_seeds)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_value = 2.0 * scipy_stats.t.sf(np.abs(mean / error), n_seeds - 1)
    p_value = np.where(error == 0, np.where(mean == 0, 1.0, 0.0), p_value)  # no spread: t is 0/0 or ±inf
    half = scipy_stats.t.ppf((1 + confidence) / 2, n_seeds - 1) * error
    return SeedT(p_value, mean - half, mean + half, sd)


def minimum_detectable_effect(sd: float | np.ndarray, n_seeds: int, alpha: float, power: float = 0.8) -> np.ndarray:
    """The true difference a two-sided paired t-test at level α detects with `power` over S seeds whose
    differences have SD `sd`: (t_{1−α/2} + t_{power}) · sd / √S, df = S − 1 (nan with one seed)."""
    if n_seeds < 2:
        return np.full(np.shape(sd), np.nan)
    df = n_seeds - 1
    return (scipy_stats.t.ppf(1 - alpha / 2, df) + scipy_stats.t.ppf(power, df)) * np.asarray(sd) / np.sqrt(n_seeds)


def holm_level(alpha: float, family_size: int) -> float:
    """The level a member of a Holm family of `family_size` tests must clear when it alone is real: Holm's first
    step, α / m. It does not depend on the other members' p, so an MDE at this level can be planned."""
    if family_size < 1:
        raise ValueError(f"a Holm family needs >= 1 test, got {family_size}")
    return alpha / family_size


def paired_t_power(effect: float, sd: float, n_seeds: int, alpha: float) -> float:
    """The power of a two-sided paired t-test at level α over S seeds to detect a true mean difference `effect`
    when the per-seed differences have SD `sd`: P(|T| > t_{1−α/2}) with T noncentral t, df = S − 1 and
    noncentrality effect · √S / sd. nan with one seed or no spread (the test is then undefined)."""
    if n_seeds < 2 or not sd > 0:
        return float("nan")
    df, shift = n_seeds - 1, effect * np.sqrt(n_seeds) / sd
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    return float(scipy_stats.nct.sf(critical, df, shift) + scipy_stats.nct.cdf(-critical, df, shift))


@dataclass(frozen=True)
class Tost:
    """The paired equivalence test over S per-seed differences with margin ±`margin` (same units), at level α.

    Two one-sided t-tests (df = S − 1): "mean ≤ −margin" against "mean > −margin" (`p_lower`) and "mean ≥
    margin" against "mean < margin" (`p_upper`). Equivalence within the margin is shown when both reject, so the
    p of the pair is the larger one; the same verdict as "the (1 − 2α) t-interval lies inside ±margin"."""

    margin: float
    alpha: float
    p_lower: float
    p_upper: float
    low: float  # the (1 − 2α) t-interval of the mean difference
    high: float

    @property
    def p_value(self) -> float:
        return max(self.p_lower, self.p_upper)

    @property
    def equivalent(self) -> bool:
        return self.p_value < self.alpha  # nan compares False: nothing shown


def seed_tost(per_seed: np.ndarray, margin: float, alpha: float) -> Tost:
    """TOST over the per-seed differences `per_seed` [S] (see `Tost`); p is nan with one seed."""
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be > 0, got {margin}")
    per_seed = np.asarray(per_seed, dtype=float)
    n_seeds = per_seed.shape[-1]
    if n_seeds < 2:
        return Tost(margin, alpha, float("nan"), float("nan"), float("nan"), float("nan"))
    mean, df = float(per_seed.mean()), n_seeds - 1
    error = float(per_seed.std(ddof=1)) / np.sqrt(n_seeds)
    if error == 0:  # no spread: each one-sided test rejects exactly when the mean is strictly inside the margin
        p_lower, p_upper = float(mean <= -margin), float(mean >= margin)
    else:
        p_lower = float(scipy_stats.t.sf((mean + margin) / error, df))
        p_upper = float(scipy_stats.t.cdf((mean - margin) / error, df))
    half = float(scipy_stats.t.ppf(1 - alpha, df)) * error
    return Tost(margin, alpha, p_lower, p_upper, mean - half, mean + half)


def interquartile_mean(values: np.ndarray) -> np.ndarray:
    """rliable's IQM: the mean of the middle 50 % of the runs (`scipy.stats.trim_mean(·, 0.25)`; with fewer
    than 4 runs nothing is trimmed and it is the mean)."""
    return scipy_stats.trim_mean(values, 0.25, axis=-1)


def probability_of_improvement(runs_a: np.ndarray, runs_b: np.ndarray) -> np.ndarray:
    """rliable's P(A > B) from run scores [..., S_a, B] and [..., S_b, B] (B benchmarks): over every pair of a
    run of A and a run of B, 1 if A's run scores higher, ½ on a tie, 0 otherwise; averaged over the pairs, then
    over the benchmarks (the Mann-Whitney U / (S_a S_b) per benchmark)."""
    a, b = runs_a[..., :, None, :], runs_b[..., None, :, :]
    wins = (a > b).astype(float) + 0.5 * (a == b)
    return wins.mean(axis=(-3, -2)).mean(axis=-1)


def improvement_interval(
    runs_a: np.ndarray, runs_b: np.ndarray, resampling: Resampling, key: str
) -> tuple[float, float]:
    """Percentile bootstrap interval of P(A > B): the runs of A and of B are resampled independently (P(A > B)
    compares unpaired runs), one draw shared by every benchmark (crossed, as the cell intervals)."""
    rng = resampling.generator(key)
    draws_a = rng.integers(0, len(runs_a), (resampling.resamples, len(runs_a)))
    draws_b = rng.integers(0, len(runs_b), (resampling.resamples, len(runs_b)))
    low, high = percentile_interval(probability_of_improvement(runs_a[draws_a], runs_b[draws_b]), resampling.confidence)
    return float(low), float(high)


def significant(p_holm: float, alpha: float) -> bool:
    """The rule behind the tables' † and compare's mark: the Holm-adjusted seed-level p is below α."""
    return p_holm < alpha  # nan compares False: no mark


def format_p(p: float, floor: float | None = None) -> str:
    """A p-value as text; one at a Monte Carlo floor 1 / (R + 1) (no draw as extreme) is "< 1/R", e.g. "< 1e-4",
    since the floor is a bound, not an estimate."""
    if p != p:
        return "–"
    if floor is not None and p <= floor * (1 + 1e-9):
        bound = 1.0 / (1.0 / floor - 1.0)
        return "< " + re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{bound:.0e}").replace("e+", "e")
    return f"{p:.3g}"
