"""Bootstrap intervals and paired sign-flip tests over per-problem scores (numpy, vectorised).

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
- **Test**: a paired sign-flip permutation test. Under "the two methods are exchangeable on each problem"
  the seed-averaged difference of a problem is as likely to be +d as −d, so each problem's sign is flipped
  at random (every seed of the problem together) and the two-sided p-value is (1 + #{|T*| ≥ |T|}) / (1 + R),
  which never claims more than R flips can show. The test is about the runs compared: a difference that
  comes from the training seed counts as real for it, which only more seeds can rule out.
- **Holm** step-down adjustment for a family of such p-values.
- **The mark** (`significant`): the Holm-adjusted p-value is below α *and* the paired bootstrap interval of
  the difference excludes 0. The second condition brings in the seeds: with S ≥ 2 seeds the interval
  resamples them, so a difference that the seeds' spread could explain is not marked.
  (`scripts/calibrate_stats.py` measures both rules on simulated evaluations with seed effects.)

Every random draw comes from `Resampling.generator(key)`: a fixed seed and the name of what is resampled, so
a rebuild is byte-identical and one cell's draw does not depend on which other cells exist.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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
        return (f"{level} percentile bootstrap over problems (and over seeds when a cell has several), "
                f"{self.resamples:,} resamples, seed {self.seed}")  # fmt: skip


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
    per_bench = [_resampled_means(a, rng.integers(0, a.shape[-1], (draws, a.shape[-1])), seed_weights)
                 for a in scores]  # fmt: skip
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


def significant(p_holm: float, low: float, high: float, alpha: float) -> bool:
    """The rule behind the tables' † and compare's mark: adjusted p < α and an interval that excludes 0."""
    return p_holm < alpha and (low > 0 or high < 0)  # nan compares False: no mark
