"""Ratio intervals implied by a divergence threshold δ (paper Thm 4.2, Eq. 10).

KL3(w) = w - 1 - log w ≤ δ holds exactly on [l_δ, u_δ] with

    l_δ = -W_0(-e^(-1-δ)) ∈ (0, 1),   u_δ = -W_-1(-e^(-1-δ)) ∈ (1, ∞),

W_0 and W_-1 being the two real branches of Lambert's W. For δ = 0.07 that is [0.671, 1.422], and
1 - l_δ < u_δ - 1 for every δ > 0 (the asymmetry of Thm 4.2). For any other estimator f of the
divergence with f(1) = 0 and f convex, `divergence_ratio_interval` finds the interval by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from atr_grpo.clipping.base import format_interval

_BRANCH_POINT = -1.0 / math.e


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta > 0):
        raise ValueError(f"parameter 'delta' must be a finite number > 0, got {delta!r}")


def lambert_w(x: float, branch: int = 0) -> float:
    """Real Lambert W on [-1/e, 0): branch 0 (values in [-1, 0)) or branch -1 (values in (-∞, -1]).

    Halley's iteration in float64 from the branch-point series (near -1/e) or the asymptotic
    log form (W_-1 near 0); converges to machine precision in a handful of steps.
    """
    if branch not in (0, -1):
        raise ValueError(f"branch must be 0 or -1, got {branch!r}")
    if not _BRANCH_POINT <= x < 0:
        raise ValueError(f"x must lie in [-1/e, 0) for the real branches, got {x!r}")
    p2 = 2.0 * (math.e * x + 1.0)
    if p2 <= 0.0:
        return -1.0
    p = math.sqrt(p2)
    if branch == 0:
        w = -1.0 + p - p2 / 3.0 + 11.0 / 72.0 * p * p2 if x < -0.25 else x
    else:
        w = -1.0 - p - p2 / 3.0 - 11.0 / 72.0 * p * p2 if x < -0.25 else math.log(-x) - math.log(-math.log(-x))
    for _ in range(100):
        ew = math.exp(w)
        f = w * ew - x
        if f == 0.0:
            break
        step = f / (ew * (w + 1.0) - (w + 2.0) * f / (2.0 * w + 2.0))
        w -= step
        if abs(step) <= 1e-15 * (1.0 + abs(w)):
            break
    return w


def kl3_ratio_bounds(delta: float) -> tuple[float, float]:
    """(l_δ, u_δ): the ratios where KL3 = w - 1 - log w reaches δ (Eq. 10)."""
    _check_delta(delta)
    x = -math.exp(-1.0 - delta)
    return -lambert_w(x, 0), -lambert_w(x, -1)


def divergence_ratio_interval(
    estimator: Callable[[float], float], delta: float, log_range: float = 50.0, iterations: int = 60
) -> tuple[float, float]:
    """(l, u) with estimator(w) ≤ δ on [l, u] around w = 1, by bisection on log w.

    `estimator` maps a ratio w > 0 to its divergence, with estimator(1) = 0. A side on which the
    estimator never reaches δ within e^(±log_range) is unbounded: l = 0 or u = inf (KL1 = -log w,
    for example, has no upper bound). For a non-convex estimator (IS-weighted KL3 read literally)
    the feasible set need not be an interval; this returns the connected piece that contains 1.
    """
    _check_delta(delta)
    if abs(estimator(1.0)) > 1e-12:
        raise ValueError(f"the estimator must vanish at w = 1, got {estimator(1.0)!r}")

    def edge(direction: float) -> float:
        # walk out from w = 1 on a log grid to the first point outside, then bisect that cell: this finds
        # the boundary of the piece containing 1 even where the estimator is not monotone
        inside, step = 0.0, 1e-2
        while abs(inside) < log_range:
            outside = inside + direction * step
            if estimator(math.exp(outside)) > delta:
                break
            inside = outside
        else:
            return direction * log_range  # never reaches δ on this side
        for _ in range(iterations):
            middle = 0.5 * (inside + outside)
            if estimator(math.exp(middle)) <= delta:
                inside = middle
            else:
                outside = middle
        return 0.5 * (inside + outside)

    low, high = edge(-1.0), edge(1.0)
    return (0.0 if low <= -log_range else math.exp(low), math.inf if high >= log_range else math.exp(high))


def describe_bounds(delta: float) -> str:
    """'δ = 0.07 ⇔ w ∈ [0.671, 1.422]': ATR's interval (the other rules' `bounds_text` say the same for theirs)."""
    return f"δ = {delta:g} ⇔ {format_interval(*kl3_ratio_bounds(delta))}"
