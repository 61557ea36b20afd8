"""Mean@K and Pass@K from a problems × samples matrix of verdicts.

Definitions (n samples per problem, c of them correct):
- `pass_at_k(n, c, k)`: the unbiased estimator of "at least one of k samples is correct",
  1 − C(n−c, k) / C(n, k) (Chen et al., 2021), averaged over problems. It uses all n samples, so
  Pass@K for K < n has less variance than "any correct among the first K".
- **Mean@K**: the mean accuracy over the first K samples of each problem, averaged over problems.
  Mean@n is the overall mean (`mean_at_k`), the paper's Mean@8 when n = 8. Its expectation does not
  depend on K (each sample is an unbiased estimate of single-sample accuracy), which is why the paper's
  Figure 4(a) is flat; the first-K definition shows the sampling noise at small K.
- **Average**: the plain mean of the benchmarks' values (the paper's "Average" column), not a mean
  pooled over all problems.
- **Standard error** (`standard_errors`, keys `mean@K_stderr` and `pass@K_stderr`): the problem-level standard
  error of Mean@K or Pass@K. Each problem gets its own score (its Mean@K, or its unbiased Pass@K); the standard
  error is the sample SD (ddof 1) of these P scores over √P. It measures how much the value would move on
  another draw of problems and samples; it says nothing about training seeds. It is None for one problem. The
  Average's standard error is √(Σ_b SE_b²) / B over B benchmarks, taken as independent.
Values are fractions in [0, 1].
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

STDERR_SUFFIX = "_stderr"  # `mean@8` has its standard error under `mean@8_stderr`


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k)/C(n, k) as the stable product 1 − Π_{i=n−c+1}^{n} (1 − k/i); requires 1 ≤ k ≤ n."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n (an unbiased estimate needs n >= k samples), got n={n}, k={k}")
    if n - c < k:  # every size-k subset holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def _check_matrix(correct: Sequence[Sequence[bool]]) -> int:
    """The common number of samples per problem (unequal rows would bias every metric: an error)."""
    if not correct:
        raise ValueError("no problems to score")
    lengths = {len(row) for row in correct}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every problem needs the same number (>= 1) of samples, got row lengths {sorted(lengths)}")
    return lengths.pop()


def mean_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """Mean accuracy over problems × samples (all rows must have the same length)."""
    n = _check_matrix(correct)
    return sum(sum(map(bool, row)) for row in correct) / (n * len(correct))


def summarize(correct: Sequence[Sequence[bool]], ks: Iterable[int] | None = None) -> dict[str, float]:
    """{"mean@K": ..., "pass@K": ...} for each K in `ks` (default 1..n), over a [problems, n] matrix."""
    n = _check_matrix(correct)
    ks = list(range(1, n + 1)) if ks is None else sorted(set(ks))
    counts = [sum(map(bool, row)) for row in correct]
    out: dict[str, float] = {}
    for k in ks:
        if not 1 <= k <= n:
            raise ValueError(f"K={k} is outside 1..n={n}")
        out[f"mean@{k}"] = sum(sum(map(bool, row[:k])) / k for row in correct) / len(correct)
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in counts) / len(correct)
    return out


def problem_scores(correct: Sequence[Sequence[bool]], k: int) -> dict[str, list[float]]:
    """{"mean@K": [each problem's accuracy over its first K samples], "pass@K": [each problem's unbiased Pass@K]}."""
    n = _check_matrix(correct)
    if not 1 <= k <= n:
        raise ValueError(f"K={k} is outside 1..n={n}")
    return {
        f"mean@{k}": [sum(map(bool, row[:k])) / k for row in correct],
        f"pass@{k}": [pass_at_k(n, sum(map(bool, row)), k) for row in correct],
    }


def standard_errors(correct: Sequence[Sequence[bool]], ks: Iterable[int] | None = None) -> dict[str, float | None]:
    """{"mean@K_stderr": ..., "pass@K_stderr": ...} for each K in `ks` (default 1..n): the SD (ddof 1) over
    problems of the per-problem scores, divided by √P; None with a single problem (no spread to measure)."""
    n = _check_matrix(correct)
    out: dict[str, float | None] = {}
    for k in range(1, n + 1) if ks is None else sorted(set(ks)):
        for key, scores in problem_scores(correct, k).items():
            spread = statistics.stdev(scores) if len(scores) > 1 else None
            out[key + STDERR_SUFFIX] = None if spread is None else spread / math.sqrt(len(scores))
    return out


def average(per_benchmark: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """The mean over benchmarks of every metric all of them report (the paper's "Average"); a standard error
    (`*_stderr`) combines as √(Σ SE²) / B instead. Either is None when a benchmark's is None (one problem, or the
    accuracy given an answer of a benchmark without one)."""
    if not per_benchmark:
        return {}
    keys = [key for key in per_benchmark[0] if all(key in values for values in per_benchmark)]
    count = len(per_benchmark)
    out: dict[str, float | None] = {}
    for key in keys:
        values = [row[key] for row in per_benchmark]
        if any(value is None for value in values):
            out[key] = None
        elif not key.endswith(STDERR_SUFFIX):
            out[key] = sum(values) / count
        else:
            out[key] = math.sqrt(sum(value * value for value in values)) / count
    return out
