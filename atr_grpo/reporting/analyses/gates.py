"""The design gates of an analysis plan (`plan.Gates`), checked on its runs, and the noise numbers reported beside
them.

Validity: the evaluation errors of different seeds are independent, so the noise sits inside the seed SD of the
differences and the sign-flip test keeps its level. Two parts, both must hold:
- *distinct streams by construction*: at every evaluation step the endpoint reads, runs of different seeds read
  different evaluation random numbers. A run's stream at step t starts at its evaluation seed, `step_seed(eval.seed,
  t)` under `eval.seed_by_step`, else `eval.seed`; HF batch b adds b to it, so a stream spans [seed, seed + P) for P
  problems at most. Two seeds' spans must not overlap. A config without `eval.seed` cannot be verified: the gate
  fails.
- *measured independence*: the cross-seed residual correlation r̄ lies within ±max_residual_correlation. A
  residual is a sample's verdict minus its run's mean on that problem: r = y_j − ȳ over the first K samples of the
  problem, at one step and benchmark. Two runs of the same method and step but different seeds give the
  correlation Σ r·r' / √(Σ r² Σ r'²) over every (problem, sample j) pair; r̄ is the mean of that over every such
  pair of runs of the planned methods and over the endpoint's steps (and benchmarks). Residuals are centred within
  a run, so independent streams give r̄ near 0 whatever the models; a stream shared by the seeds gives r̄ near the
  correlation of two methods that share one (about 0.95 in power2).

Precision: every planned comparison's MDE at the level its test uses (`Plan.level`: α for the primary, Holm's first
step α/m for the m secondaries) is at most max_mde_share_of_margin × the equivalence margin. The MDE is the exact
sign-flip test's own: the true difference it detects with 80 % power, as a multiple of the observed SD of the
per-seed differences (`sign_flip_mde_factor`, simulated under normal differences), times that SD. It is a few
percent above the paired t MDE the plan table prints.

Reported, not gated: the evaluation noise σ_e of a seed's difference (`eval_noise`), the seed SD of the
differences SD_d, the noise share σ_e²/SD_d² with its 95 % χ² interval (S − 1 degrees of freedom in SD_d², σ_e
taken as known: its bootstrap SE is about 1 % of it), and the MDE at infinite samples, the same factor times
√max(SD_d² − σ_e², 0): what more evaluation samples could buy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from atr_grpo.evaluation.sampling import step_seed
from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses import eval_noise
from atr_grpo.reporting.analyses.planned import PlannedResult
from atr_grpo.reporting.analyses.tables import Table
from atr_grpo.reporting.plan import Plan
from atr_grpo.reporting.runs import AVERAGE, Run, two_decimals

POWER = 0.8
SIMULATIONS = 4000  # normal datasets per power evaluation of the MDE factor
FACTOR_SEED = 0


@dataclass(frozen=True)
class Validity:
    streams_distinct: bool
    streams_note: str  # why not, or how many streams were checked
    correlation: float  # r̄
    correlation_low: float  # the smallest and largest pair's correlation
    correlation_high: float
    pairs: int  # run pairs (same method and step, different seeds) averaged
    threshold: float

    @property
    def passes(self) -> bool:
        return self.streams_distinct and abs(self.correlation) < self.threshold


@dataclass(frozen=True)
class Precision:
    """One planned comparison's precision gate and the noise numbers reported beside it."""

    model: str
    label: str
    role: str
    level: float
    n_seeds: int
    sd: float  # SD_d, ddof 1
    mde_t: float  # the paired t MDE (the plan table's)
    factor: float  # the sign-flip test's MDE in units of SD_d
    mde: float  # factor × SD_d
    limit: float  # max_mde_share_of_margin × margin
    evaluation_sd: float  # σ_e
    noise_share: float  # σ_e² / SD_d²
    share_low: float  # its 95 % χ² interval, capped at 1
    share_high: float
    mde_infinite: float  # factor × √max(SD_d² − σ_e², 0)

    @property
    def passes(self) -> bool:
        return self.mde <= self.limit


@dataclass(frozen=True)
class GateResult:
    validity: dict[str, Validity]  # by model
    precision: list[Precision]

    def passes(self, model: str) -> bool:
        return self.validity[model].passes and all(p.passes for p in self.precision if p.model == model)


@functools.cache
def sign_flip_mde_factor(n_seeds: int, level: float, power: float = POWER) -> float:
    """The true mean difference, in units of the SD of the per-seed differences, that the exact two-sided sign-flip
    test at `level` detects with `power` over `n_seeds` normal differences: found by bisection on a simulated power
    curve (SIMULATIONS datasets from one fixed stream, so the same numbers give the same factor); nan when even an
    infinite difference cannot reach `level` (2^(1−S) ≥ level)."""
    if n_seeds < 2 or 2.0 ** (1 - n_seeds) >= level:
        return math.nan
    noise = np.random.default_rng(FACTOR_SEED).standard_normal((SIMULATIONS, n_seeds))
    bits = (np.arange(2**n_seeds)[:, None] >> np.arange(n_seeds)) & 1
    signs = 1.0 - 2.0 * bits
    chunk = max(1, 2**22 // len(signs))

    def rejects(shift: float) -> float:
        hits = 0
        for start in range(0, SIMULATIONS, chunk):
            d = noise[start : start + chunk] + shift
            observed = np.abs(d.sum(axis=1))
            extreme = (np.abs(d @ signs.T) >= observed[:, None] - stats.ROUNDING).sum(axis=1)
            hits += int(np.sum(extreme / len(signs) < level))
        return hits / SIMULATIONS

    low, high = 0.0, 10.0
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (low, middle) if rejects(middle) >= power else (middle, high)
    return high


def noise_share_interval(evaluation_sd: float, sd: float, n_seeds: int) -> tuple[float, float, float]:
    """(σ_e²/SD_d², its 95 % χ² interval): SD_d² · (S − 1) / Var(d) is χ² with S − 1 degrees of freedom, σ_e taken as
    known. The interval is capped at 1 (the noise cannot exceed the whole variance); the point is not, so a share
    above 1 shows a seed SD below the noise alone."""
    if not sd > 0 or math.isnan(evaluation_sd) or n_seeds < 2:
        return math.nan, math.nan, math.nan
    share, df = evaluation_sd**2 / sd**2, n_seeds - 1
    low = share * scipy_stats.chi2.ppf(0.025, df) / df
    high = share * scipy_stats.chi2.ppf(0.975, df) / df
    return share, min(low, 1.0), min(high, 1.0)


def check(runs: list[Run], plan: Plan, results: list[PlannedResult]) -> GateResult:
    """The plan's gates on the runs of its experiment and the planned analysis `results`; the plan must have gates."""
    if plan.gates is None:
        raise ValueError(f"{plan.path}: the plan has no gates")
    runs = [r for r in runs if r.experiment == plan.experiment and r.seed in plan.seeds]
    methods = list(dict.fromkeys(m for c in (plan.primary, *plan.secondary) for m in (c.a, c.b)))
    validity = {}
    for model in sorted({r.model for r in runs}):
        of_model = [r for r in runs if r.model == model and r.method in methods]
        validity[model] = _validity(of_model, plan)
    # the margin is in points of the plan's metric at its endpoint: a test on one of `secondary_metrics`, or on the
    # final evaluation (another endpoint and sampling), is not gated
    precision = [_precision(r, runs, plan) for r in results if not r.metric and not r.evaluations]
    return GateResult(validity, precision)


def _benchmarks(runs: list[Run], plan: Plan) -> list[str]:
    configured = list(dict.fromkeys(b for r in runs for b in r.benchmarks))
    return configured if plan.benchmark == AVERAGE else [plan.benchmark]


def _validity(runs: list[Run], plan: Plan) -> Validity:
    benchmarks = _benchmarks(runs, plan)
    steps = {r.path: cells.endpoint_steps(r, benchmarks[0], plan.endpoint) for r in runs}
    distinct, note = _streams_distinct(runs, steps, benchmarks)
    k = runs[0].k
    correlations = []
    by_method: dict[str, list[Run]] = {}
    for run in runs:
        by_method.setdefault(run.method, []).append(run)
    for group in by_method.values():
        group = sorted(group, key=lambda r: r.seed)
        residuals = {r.path: {t: _residuals(r, t, benchmarks, k) for t in steps[r.path]} for r in group}
        for i, first in enumerate(group):
            for second in group[i + 1 :]:
                for step in set(steps[first.path]) & set(steps[second.path]):
                    a, b = residuals[first.path][step], residuals[second.path][step]
                    scale = math.sqrt(float(a @ a) * float(b @ b))
                    if scale > 0:
                        correlations.append(float(a @ b) / scale)
    mean = float(np.mean(correlations)) if correlations else math.nan
    low, high = (min(correlations), max(correlations)) if correlations else (math.nan, math.nan)
    assert plan.gates is not None
    return Validity(distinct, note, mean, low, high, len(correlations), plan.gates.max_residual_correlation)


def _residuals(run: Run, step: int, benchmarks: list[str], k: int) -> np.ndarray:
    """Every (problem, sample) residual of one evaluation, y_j − ȳ over the problem's first K samples, in problem
    id order (the same order in every run of the same benchmarks)."""
    parts = []
    for benchmark in benchmarks:
        verdicts = run.verdicts(step, benchmark)
        matrix = np.array([verdicts[pid][:k] for pid in sorted(verdicts)], dtype=float)
        parts.append((matrix - matrix.mean(axis=1, keepdims=True)).ravel())
    return np.concatenate(parts)


def _streams_distinct(runs: list[Run], steps: dict, benchmarks: list[str]) -> tuple[bool, str]:
    """(whether runs of different seeds read disjoint evaluation streams at every step read, why not / how many)."""
    spans: dict[int, set[tuple[int, int]]] = {}
    for run in runs:
        section = run.config.get("eval") or {}
        if "seed" not in section:
            return False, f"{run.path.name}: its config records no eval.seed, so its stream cannot be verified"
        problems = sum(len(run.verdicts(steps[run.path][0], b)) for b in benchmarks) if steps[run.path] else 0
        for step in steps[run.path]:
            start = step_seed(int(section["seed"]), step) if section.get("seed_by_step") else int(section["seed"])
            spans.setdefault(run.seed, set()).add((start, start + max(problems, 1)))
    seeds = sorted(spans)
    for i, seed in enumerate(seeds):
        for other in seeds[i + 1 :]:
            for start, end in spans[seed]:
                for other_start, other_end in spans[other]:
                    if start < other_end and other_start < end:
                        return False, f"seeds {seed} and {other} read overlapping evaluation streams (from {start})"
    count = sum(len(s) for s in spans.values())
    return True, f"{count} streams of {len(seeds)} seeds, pairwise disjoint"


def _precision(result: PlannedResult, runs: list[Run], plan: Plan) -> Precision:
    assert plan.gates is not None
    d = result.difference
    n_seeds, sd = len(d.seeds), float(d.sd)
    factor = sign_flip_mde_factor(n_seeds, result.level)
    sigma_e = _evaluation_sd(result, runs, plan)
    share, low, high = noise_share_interval(sigma_e, sd, n_seeds)
    training = math.sqrt(max(sd**2 - sigma_e**2, 0.0)) if not math.isnan(sigma_e) else math.nan
    return Precision(
        model=result.model,
        label=result.comparison.label,
        role=result.role,
        level=result.level,
        n_seeds=n_seeds,
        sd=sd,
        mde_t=result.mde,
        factor=factor,
        mde=factor * sd,
        limit=plan.gates.max_mde_share_of_margin * plan.equivalence_margin,
        evaluation_sd=sigma_e,
        noise_share=share,
        share_low=low,
        share_high=high,
        mde_infinite=factor * training,
    )


def _evaluation_sd(result: PlannedResult, runs: list[Run], plan: Plan) -> float:
    """σ_e of the comparison's seed differences, as `compare` computes it (`eval_noise.evaluation_sd`)."""
    of_model = [r for r in runs if r.model == result.model]
    methods = (result.comparison.a, result.comparison.b)
    sides = [sorted((r for r in of_model if r.method == m), key=lambda r: r.seed) for m in methods]
    benchmarks = list(dict.fromkeys(b for r in of_model for b in r.benchmarks))
    key = plan.benchmark
    read = benchmarks[0] if key == AVERAGE else key
    steps = [[cells.endpoint_steps(r, read, plan.endpoint) for r in side] for side in sides]
    return eval_noise.evaluation_sd(*sides, *steps, plan.metric, key, benchmarks)


GATE_COLUMNS = [
    "model",
    "gate",
    "comparison",
    "level",
    "n_seeds",
    "value",
    "limit",
    "verdict",
    "sd_d",
    "mde_t",
    "evaluation_sd",
    "noise_share",
    "share_low",
    "share_high",
    "mde_infinite",
]


def gates_table(result: GateResult, plan: Plan) -> Table:
    """The `gates` table: per model, the validity gate (r̄ against its bound) and one precision row per planned
    comparison (its sign-flip MDE against the limit), with the reported noise numbers beside them."""
    assert plan.gates is not None
    rows = []
    for model, v in result.validity.items():
        rows.append(
            {
                "model": model,
                "gate": "validity",
                "comparison": "every planned method, seed pairs",
                "value": f"{v.correlation:+.4f}",
                "limit": v.threshold,
                "verdict": ("passes" if v.passes else "fails") + f": {v.streams_note}; r̄ over {v.pairs} run pairs",
            }
        )
        for p in (p for p in result.precision if p.model == model):
            rows.append(
                {
                    "model": model,
                    "gate": "precision",
                    "comparison": p.label,
                    "level": p.level,
                    "n_seeds": str(p.n_seeds),
                    "value": f"{p.mde:.2f}",
                    "limit": p.limit,
                    "verdict": "passes" if p.passes else "fails",
                    "sd_d": round(p.sd, 3),
                    "mde_t": two_decimals(p.mde_t),
                    "evaluation_sd": round(p.evaluation_sd, 3),
                    "noise_share": two_decimals(p.noise_share),
                    "share_low": two_decimals(p.share_low),
                    "share_high": two_decimals(p.share_high),
                    "mde_infinite": two_decimals(p.mde_infinite),
                }
            )
    rows = [{c: row.get(c, math.nan) for c in GATE_COLUMNS} for row in rows]
    notes = [*(a.describe() for a in plan.amendments), *gate_notes(plan)]
    formats = {"level": ".3g", "limit": "g", "sd_d": ".3f", "evaluation_sd": ".3f"}
    blank = dict.fromkeys(GATE_COLUMNS, "–")
    return Table("gates", GATE_COLUMNS, rows, [], notes, formats, nan_text=blank)


def gate_notes(plan: Plan) -> list[str]:
    """What the gates are, in words (under the table and under `compare`'s)."""
    gates = plan.gates
    assert gates is not None
    margin, share, bound = plan.equivalence_margin, gates.max_mde_share_of_margin, gates.max_residual_correlation
    return [
        f"validity: the seeds read distinct evaluation streams by construction (eval.seed, seed_by_step), and the "
        f"cross-seed residual correlation r̄ (a sample's verdict minus its run's mean on the problem, correlated "
        f"between runs of one method and step with different seeds) lies within ±{bound:g}",
        f"precision: each planned comparison's MDE (80% power) of the exact sign-flip test at the level its test uses, "
        f"from the observed SD of the per-seed differences (sd_d, ddof 1), is at most {share:g} × the margin "
        f"±{margin:g} = {share * margin:g} points; mde_t is the paired t MDE of the plan table",
        "reported, not gated: evaluation_sd (σ_e, the draws alone), noise_share σ_e²/sd_d² with its 95% χ² interval "
        "(share_low, share_high; the interval capped at 1), mde_infinite: the sign-flip MDE with the evaluation "
        "noise removed",
    ]
