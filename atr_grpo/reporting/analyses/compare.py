"""`python -m atr_grpo.results compare A B`: method A against method B, the run (seed) as the unit.

Within each (study, model) that has runs of both methods, every benchmark (and their Average) and every
metric gets `cells.compare`: A − B in points, one difference per seed pair, the exact sign-flip test over the
seeds with the smallest p the design can reach, the paired t-test and t-interval, the minimum detectable
effect, the per-seed differences; then rliable's IQM of each method and P(A > B), and the problem-level test as
a secondary column. The Holm family is fixed, not the rows printed: every method of the study and model
compared with B in the same benchmark × metric column, which is the tables' family when B is `clip`; the
random streams are named by `cells.comparison_key`. So the same comparison prints the same numbers here and in
the tables. Runs are paired by seed and problems by id: A and B on the seeds both have (the others named in a
note; no common seed stops the comparison), and a problem that A or B lacks stops it with an error that names it
(a family member that cannot be paired is left out, and named).

A study is `study` in the runs' config.yaml (else their experiment); a method is named by its rule and the settings
its launch changed (`runs.name_methods`), and two runs of one point and seed stop the comparison
(`runs.refuse_repeats`). Under each seed table, `no_effect` says when the comparison cannot show anything:
identical runs, a rule that never acted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses import eval_noise, no_effect
from atr_grpo.reporting.metric import EXPECTED, Metric, defaults
from atr_grpo.reporting.runs import AVERAGE, Run, repeat_free


class CompareError(ValueError):
    pass


@dataclass
class Row:
    experiment: str  # the study (`Run.study`: the experiment unless the config names another)
    model: str
    benchmark: str
    metric: str
    mean_a: float
    mean_b: float
    difference: cells.Difference
    steps_a: list[tuple[int, ...]]
    steps_b: list[tuple[int, ...]]
    p_holm: float = float("nan")
    family: list[str] = field(default_factory=list)  # the methods tested against B in this column
    left_out: list[str] = field(default_factory=list)  # methods that could not be paired with B, and why
    endpoint: str = "final"
    level: float = float("nan")  # the level its test uses: Holm's first step α / m, or the plan's (`planned`)
    planned: Any = None  # a planned.PlannedResult when the experiment's analysis plan tests this comparison
    warnings: list[str] = field(default_factory=list)  # what the comparison cannot show (`no_effect`)
    evaluation_sd: float = float("nan")  # a seed's difference from the draws alone, in points (`eval_noise`)
    detectable: tuple[float, float] = (math.nan, math.nan)  # (MDE, observed power) at `level` (`detectable`)
    alike: bool = False  # every seed pair drew the same evaluation samples (`no_effect.evaluations_alike`)
    seeds_left_out: str = ""  # the seeds only one method has, left out of the pairing (`common_seeds`)


def _names(runs: list[Run], attribute: str) -> str:
    return ", ".join(sorted({str(getattr(r, attribute)) for r in runs})) or "none"


@dataclass(frozen=True)
class HolmFamily:
    """One Holm family: the comparisons with one reference in one column (a study or model × benchmark × metric
    × endpoint). `adjusted` maps each member to its Holm-adjusted p; `level` is Holm's first step α / m, the
    level at which each member's MDE and power are computed (`detectable`)."""

    adjusted: dict[Hashable, float]
    level: float


def holm_family(members: Iterable[tuple[Hashable, float]], alpha: float) -> HolmFamily:
    """The one builder of a Holm family, from (member, unadjusted p) pairs: `compare` names a member by its
    method, the tables by its runs, so a row that repeats another's runs (clip-tuned) is one member, not two."""
    p_values = dict(members)
    adjusted = dict(zip(p_values, stats.holm(list(p_values.values()))))
    return HolmFamily(adjusted, stats.holm_level(alpha, len(p_values)))


def holm_against(
    reference: str,
    tested: str,
    methods: dict[str, list[Run]],
    p_tested: float,
    metric: str,
    key: str,
    benchmarks: list[str],
    resampling: stats.Resampling,
    endpoint: str = "final",
    step: int | None = None,
) -> tuple[HolmFamily, list[str]]:
    """(the Holm family of `tested`, the members left out): the family is every method in `methods` (one study
    and model) compared with `reference` on `key` × `metric` at `endpoint` (or `step`), at the seed level."""
    experiment, model = next(iter(methods.values()))[0].study, next(iter(methods.values()))[0].model
    reference_scores = cells.cell_scores(methods[reference], metric, key, benchmarks, endpoint, step)
    members, left_out = [(tested, p_tested)], []
    for method, runs in sorted(methods.items()):
        if method in (reference, tested):
            continue
        try:
            scores = cells.cell_scores(runs, metric, key, benchmarks, endpoint, step)
            differences = cells.paired(scores, reference_scores, (method, reference))
        except cells.ScoreError as err:
            left_out.append(f"{method} ({err})")
            continue
        label = cells.comparison_key(experiment, model, method, reference, metric, key, endpoint)
        members.append((method, cells.seed_pvalue(differences, resampling, label)))
    return holm_family(members, 1 - resampling.confidence), left_out


def compare_methods(
    runs: list[Run],
    method_a: str,
    method_b: str,
    resampling: stats.Resampling,
    benchmarks: list[str] | None = None,
    metrics: list[str] | None = None,
    step: int | None = None,
    endpoint: str = "final",
) -> list[Row]:
    """Every (study, model, benchmark or Average, metric) comparison of A with B in `runs`, at `endpoint`
    (`final` or `auc`; `step` reads one evaluation step instead). Each row carries its block's warnings."""
    _check_request(method_a, method_b, metrics, step, endpoint)
    rows = []
    for (experiment, model), methods in _paired_groups(runs, method_a, method_b).items():
        configured = list(dict.fromkeys(b for r in methods[method_a] + methods[method_b] for b in r.benchmarks))
        keys = _cell_keys(configured, benchmarks, f"{experiment}/{model}")
        k = methods[method_a][0].k
        pair, left_out = common_seeds(methods[method_a], methods[method_b], f"{experiment}/{model}")
        warnings = no_effect.pair_warnings(*pair)
        warnings += no_effect.rule_warnings(methods[method_a] + methods[method_b])
        alike = no_effect.evaluations_alike(*pair)
        for metric in metrics or defaults(k):
            for key in keys:
                try:
                    row = _compare_cell(
                        methods, pair, method_a, method_b, metric, key, configured, resampling, endpoint, step
                    )
                except cells.ScoreError as err:
                    raise CompareError(f"{experiment}/{model}, {key} {metric}: {err}") from None
                row.warnings, row.alike, row.seeds_left_out = warnings, alike, left_out
                rows.append(row)
    return rows


def common_seeds(runs_a: list[Run], runs_b: list[Run], where: str) -> tuple[tuple[list[Run], list[Run]], str]:
    """(the runs of A and of B on the seeds both have, the seeds left out in words: "" when none is); CompareError
    when they share no seed. The tables' Holm family pairs only methods with the same seeds (`holm_against`)."""
    seeds_a, seeds_b = ({run.seed for run in runs} for runs in (runs_a, runs_b))
    common = seeds_a & seeds_b
    if not common:
        raise CompareError(
            f"{where}: pairing needs a seed both methods have: {runs_a[0].method} has {sorted(seeds_a)}, "
            f"{runs_b[0].method} has {sorted(seeds_b)}"
        )
    left = [
        f"{runs[0].method} seed{'s' * (len(only) > 1)} {', '.join(map(str, sorted(only)))}"
        for runs, only in ((runs_a, seeds_a - common), (runs_b, seeds_b - common))
        if only
    ]
    pair = tuple([run for run in runs if run.seed in common] for runs in (runs_a, runs_b))
    return pair, "; ".join(left)  # type: ignore[return-value]


def _check_request(method_a: str, method_b: str, metrics: list[str] | None, step: int | None, endpoint: str) -> None:
    """Refuse a comparison that cannot mean anything, naming the option."""
    if method_a == method_b:
        raise CompareError(f"compare needs two different methods, got {method_a!r} twice")
    if endpoint not in cells.ENDPOINTS:
        raise CompareError(f"--endpoint {endpoint!r}: expected one of {', '.join(cells.ENDPOINTS)}")
    if step is not None and endpoint != "final":
        raise CompareError(f"--step {step} reads one evaluation; it cannot be combined with --endpoint {endpoint}")
    for metric in metrics or []:
        if not Metric.is_name(metric):
            raise CompareError(f"--metric {metric!r}: expected {EXPECTED}")


def _paired_groups(runs: list[Run], method_a: str, method_b: str) -> dict[tuple[str, str], dict[str, list[Run]]]:
    """{(study, model): {method: runs}} for each study and model with runs of both A and B, in order; CompareError
    when a method has no runs, the two never meet, or two runs repeat one point (`refuse_repeats`)."""
    try:
        kept = repeat_free(runs)
    except ValueError as err:
        raise CompareError(str(err)) from None
    for method in (method_a, method_b):
        if not any(r.method == method for r in kept):
            raise CompareError(f"no runs of method {method!r} (methods found: {_names(kept, 'method')})")
    groups: dict[tuple[str, str], dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for run in kept:
        groups[(run.study, run.model)][run.method].append(run)
    pairs = {key: sides for key, sides in sorted(groups.items()) if method_a in sides and method_b in sides}
    if not pairs:
        where = {m: sorted({f"{r.study}/{r.model}" for r in kept if r.method == m}) for m in (method_a, method_b)}
        raise CompareError(
            f"{method_a} and {method_b} never share a study and model: {method_a} in "
            f"{', '.join(where[method_a])}; {method_b} in {', '.join(where[method_b])}"
        )
    return pairs


def _cell_keys(configured: list[str], benchmarks: list[str] | None, where: str) -> list[str]:
    """The benchmarks compared (and their Average, when there are several), as `--benchmark` selects them."""
    unknown = [b for b in benchmarks or [] if b not in configured and b != AVERAGE]
    if unknown:
        listed = ", ".join(configured)
        raise CompareError(f"--benchmark {', '.join(unknown)}: {where} evaluates {listed} (and {AVERAGE})")
    keys = configured + [AVERAGE] * (len(configured) > 1)
    return [k for k in keys if benchmarks is None or k in benchmarks]


def _compare_cell(
    methods: dict[str, list[Run]],
    pair: tuple[list[Run], list[Run]],
    method_a: str,
    method_b: str,
    metric: str,
    key: str,
    configured: list[str],
    resampling: stats.Resampling,
    endpoint: str,
    step: int | None,
) -> Row:
    """A against B on one benchmark (or the Average) and metric, paired on the runs of `pair` (their common seeds),
    with its Holm adjustment over `methods` (`holm_against`)."""
    runs_a, runs_b = pair
    experiment, model = runs_a[0].study, runs_a[0].model
    a = cells.cell_scores(runs_a, metric, key, configured, endpoint, step)
    b = cells.cell_scores(runs_b, metric, key, configured, endpoint, step)
    label = cells.comparison_key(experiment, model, method_a, method_b, metric, key, endpoint)
    difference = cells.compare(a, b, resampling, label, (method_a, method_b))
    p_value = difference.p_value
    family, left_out = holm_against(
        method_b, method_a, methods, p_value, metric, key, configured, resampling, endpoint, step
    )
    mean_a, mean_b = (100 * float(stats.estimate(s.arrays())) for s in (a, b))
    row = Row(
        experiment, model, key, metric, mean_a, mean_b, difference, a.steps, b.steps, p_holm=family.adjusted[method_a]
    )
    row.family, row.left_out, row.endpoint, row.level = sorted(family.adjusted), left_out, a.endpoint, family.level
    significant = stats.significant(row.p_holm, 1 - resampling.confidence)
    row.detectable = detectable(difference, family.level, significant)
    pairs = cells.seed_pairs(runs_a, runs_b)  # in the seed order of `a` and of the differences
    ordered, partners = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
    steps_b = [b.steps[row] for row in b.rows([run.seed for run in ordered])]
    row.evaluation_sd = eval_noise.evaluation_sd(ordered, partners, a.steps, steps_b, metric, key, configured)
    return row


def seed_design_note(n_seeds: list[int], resampling: stats.Resampling, alpha: float) -> str:
    """What the seed-level test can show with these numbers of seeds, in words (for the notes of every table)."""
    parts = []
    for n in sorted(set(n_seeds)):
        floor = stats.smallest_seed_pvalue(n, resampling)
        how = "all 2^S sign patterns" if stats.seed_test_is_exact(n) else f"{resampling.resamples:,} random patterns"
        verdict = "so no difference can be marked" if floor >= alpha else "before Holm's adjustment"
        parts.append(
            f"with {n} seed{'s' * (n != 1)} ({how}) the smallest attainable p is "
            f"{stats.format_p(floor, None if stats.seed_test_is_exact(n) else floor)}, {verdict}"
        )
    return "; ".join(parts)


SEED_TEST = f"all 2^S sign patterns up to {stats.EXACT_SEEDS} seeds, random patterns above"


def detectable(d: cells.Difference, level: float, significant: bool) -> tuple[float, float]:
    """(the MDE: the true difference a two-sided paired t-test at `level` detects with 80 % power at the observed
    SD of the per-seed differences; the power of that test to detect the observed difference, nan when it is
    significant), both from this comparison's own spread; nan with one seed, and with no spread (equal per-seed
    differences, such as identical evaluations: an MDE of 0 would read as a perfectly sensitive test)."""
    n_seeds = len(d.seeds)
    if d.no_spread:
        return math.nan, math.nan
    mde = float(stats.minimum_detectable_effect(d.sd, n_seeds, level))
    return mde, math.nan if significant else stats.paired_t_power(d.difference, d.sd, n_seeds, level)
