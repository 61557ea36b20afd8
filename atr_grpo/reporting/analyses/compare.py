"""`python -m atr_grpo.results compare A B`: method A against method B, the run (seed) as the unit.

Within each (study, model) that has runs of both methods, every benchmark (and their Average) and every
metric gets `cells.compare`: A − B in points, one difference per seed pair, the exact sign-flip test over the
seeds with the smallest p the design can reach, the paired t-test and t-interval, the minimum detectable
effect, the per-seed differences; then rliable's IQM of each method and P(A > B), and the problem-level test as
a secondary column. The Holm family is fixed, not the rows printed: every method of the study and model
compared with B in the same benchmark × metric column, which is the tables' family when B is `clip`; the
random streams are named by `cells.comparison_key`. So the same comparison prints the same numbers here and in
the tables. Runs are paired by seed and problems by id; a seed or a problem that A or B lacks stops the
comparison with an error that names it (a family member that cannot be paired is left out, and named).

A study is `study` in the runs' config.yaml (else their experiment); its methods are named by the settings that
differ within it (`runs.name_methods`), and two runs of one point and seed stop the comparison
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
from atr_grpo.reporting.runs import AVERAGE, Run, refuse_repeats


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
        warnings = no_effect.pair_warnings(methods[method_a], methods[method_b])
        warnings += no_effect.rule_warnings(methods[method_a] + methods[method_b])
        for metric in metrics or defaults(k):
            for key in keys:
                try:
                    row = _compare_cell(
                        methods, method_a, method_b, metric, key, configured, resampling, endpoint, step
                    )
                except cells.ScoreError as err:
                    raise CompareError(f"{experiment}/{model}, {key} {metric}: {err}") from None
                row.warnings = warnings
                rows.append(row)
    return rows


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
        kept = refuse_repeats(runs)
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
    method_a: str,
    method_b: str,
    metric: str,
    key: str,
    configured: list[str],
    resampling: stats.Resampling,
    endpoint: str,
    step: int | None,
) -> Row:
    """A against B on one benchmark (or the Average) and metric, with its Holm adjustment (`holm_against`)."""
    runs_a, runs_b = methods[method_a], methods[method_b]
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


def format_rows(rows: list[Row], method_a: str, method_b: str, resampling: stats.Resampling) -> str:
    """Markdown: two tables per (experiment, model), the seed-level test and the robust summaries, then how the
    numbers were computed."""
    lines = []
    for experiment, model in dict.fromkeys((r.experiment, r.model) for r in rows):
        block = [r for r in rows if (r.experiment, r.model) == (experiment, model)]
        lines += _seed_table(block, method_a, method_b, resampling)
        lines += _warning_lines(block)
        lines += _robust_table(block, method_a, method_b, resampling)
        lines += _block_notes(block, method_a, method_b, resampling)
    lines += _method_notes(rows, resampling)
    return "\n".join(lines) + "\n"


def _seed_table(block: list[Row], method_a: str, method_b: str, resampling: stats.Resampling) -> list[str]:
    """One (experiment, model)'s heading and its seed-level table."""
    level, alpha = f"{100 * resampling.confidence:g}%", 1 - resampling.confidence
    experiment, model = block[0].experiment, block[0].model
    seeds = ", ".join(map(str, block[0].difference.seeds))
    steps = sorted({s for r in block for read in r.steps_a + r.steps_b for s in read})
    auc = block[0].endpoint == "auc"
    lines = [
        f"## {method_a} − {method_b}: {experiment}, {model} (seeds {seeds}; "
        f"{'AUC: each run’s mean over its evaluation steps' if auc else 'evaluation steps'} "
        f"{', '.join(map(str, steps))})",
        "",
        f"| benchmark | metric | {method_a} | {method_b} | difference | per seed | {level} CI (t, seeds) "
        "| p (seeds) | smallest p | p (Holm) | † | p (paired t) | MDE (80%) | power (observed) |",
        "|---|---|---:|---:|---:|---|---|---:|---:|---:|:-:|---:|---:|---:|",
    ]
    for r in block:
        cells_ = seed_level_cells(r.difference, r.p_holm, alpha, r.detectable)
        lines.append(f"| {r.benchmark} | {r.metric} | {r.mean_a:.2f} | {r.mean_b:.2f} | {' | '.join(cells_)} |")
    return lines


def _warning_lines(block: list[Row]) -> list[str]:
    """Under a block's seed table: what its comparison cannot show (identical runs, a rule that never acted)."""
    return [""] + [f"**warning: {line}**" for line in block[0].warnings] if block[0].warnings else []


def _robust_table(block: list[Row], method_a: str, method_b: str, resampling: stats.Resampling) -> list[str]:
    """One (experiment, model)'s robust summaries: IQMs, P(A > B), the problem-level test."""
    level = f"{100 * resampling.confidence:g}%"
    lines = [
        "",
        f"| benchmark | metric | IQM {method_a} | IQM {method_b} | P({method_a} > {method_b}) "
        f"| {level} CI | p (problems; these runs only) | problems |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in block:
        d = r.difference
        lines.append(
            f"| {r.benchmark} | {r.metric} | {d.iqm_a:.2f} | {d.iqm_b:.2f} | {d.improvement:.2f} "
            f"| [{d.improvement_low:.2f}, {d.improvement_high:.2f}] "
            f"| {stats.format_p(d.p_problems, d.p_problems_floor)} | {d.problems} |"
        )
    return lines


def _block_notes(block: list[Row], method_a: str, method_b: str, resampling: stats.Resampling) -> list[str]:
    """Under one (experiment, model)'s tables: steps that differ, the Holm family and who is left out, the seeds."""
    alpha = 1 - resampling.confidence
    lines = []
    if any(r.steps_a != r.steps_b for r in block):
        lines.append(
            f"\nsteps differ between the paired runs: {method_a} {_reads(block[0].steps_a)}, {method_b} "
            f"{_reads(block[0].steps_b)}"
        )
    family = sorted({m for r in block if r.planned is None for m in r.family})  # planned rows: the plan's, below
    lines.append("")
    if family:
        lines.append(
            f"Holm family: {len(family)} method(s) compared with {method_b} in each benchmark × metric column"
            f"{' the analysis plan does not name' if any(r.planned for r in block) else ''}: {', '.join(family)}."
        )
    left_out = sorted({m for r in block for m in r.left_out})
    if left_out:
        lines.append(f"Left out of the family (cannot be paired with {method_b}): {'; '.join(left_out)}.")
    for r in block:
        if r.planned is not None:
            lines.append(
                f"{r.benchmark} {r.metric}: the analysis plan's {r.planned.role} comparison. Its family is the "
                f"plan's ({', '.join(r.family)}; serial gatekeeping), its p (Holm) the gatekept p, its MDE, power "
                f"and TOST at level {r.level:.3g}: {r.planned.describe()}."
            )
    for r in block:
        if not math.isnan(r.evaluation_sd):
            half = r.evaluation_sd < r.difference.sd / 2
            lines.append(
                f"{r.benchmark} {r.metric}: evaluation noise of a seed's difference {r.evaluation_sd:.2f} points (the "
                f"draws alone, from the paired samples' spread), seed SD of the differences "
                f"{r.difference.sd:.2f}: {'below' if half else 'not below'} half of it."
            )
    lines.append(f"Seeds: {seed_design_note([len(r.difference.seeds) for r in block], resampling, alpha)}.")
    lines.append("")
    return lines


def _method_notes(rows: list[Row], resampling: stats.Resampling) -> list[str]:
    """How the numbers were computed (and what AUC means, when a row is one)."""
    alpha = 1 - resampling.confidence
    lines = []
    if any(r.endpoint == "auc" for r in rows):
        lines += [
            "AUC: a run's value is the mean of its evaluations after step 0 (each problem's score averaged over "
            "those steps, then over the problems), the `auc` of the endpoints table; step 0 is left out because "
            "it is the same adapter for every method of a seed.",
            "",
        ]
    lines += [
        f"Values in points (percent). The run is the unit: each seed pair gives one difference (per seed). "
        f"p (seeds): two-sided exact sign-flip test over the seed pairs ({SEED_TEST}); smallest p: the "
        f"smallest p that number of seeds can give. p (Holm): adjusted over the Holm family above (the same "
        f"family as the tables' † when B is clip). † = p (Holm) < {alpha:g}. CI and p (paired t): t-interval "
        f"and paired t-test over the seed differences (df = seeds − 1). MDE: the true difference a two-sided "
        f"paired t-test detects with 80% power given this comparison's own SD of the per-seed differences, "
        f"(t_{{1−a/2}} + t_{{0.8}})·SD/√S, at the level a its test uses: Holm's first step {alpha:g} / m in a "
        f"family of m (the plan's level for a planned comparison). power (observed): beside a difference without "
        f"†, the power of that test to detect the observed difference (noncentral t). Without † no difference is "
        f"shown, and equality only by an equivalence test with a margin fixed in the experiment's analysis plan: "
        f"otherwise 'not established'. IQM: rliable's interquartile mean of the runs' "
        f"values. P(A > B): rliable's probability of improvement over every pair of an A run and a B run "
        f"(½ for ties), averaged over the benchmarks; interval: {resampling.resamples:,} bootstrap "
        f"resamples of the runs of each method. p (problems): sign-flip test over problems (each problem's "
        f"difference averaged over the seeds, {resampling.resamples:,} flips): whether these runs differ "
        f"beyond evaluation noise, not whether the methods do; '< x' means no flip was as extreme."
    ]
    return lines


def _reads(steps: list[tuple[int, ...]]) -> str:
    """The steps read for each run, in seed order: `128` for one evaluation, `32+64+96+128` for an AUC."""
    return "[" + ", ".join("+".join(map(str, read)) for read in steps) + "]"


SEED_TEST = f"all 2^S sign patterns up to {stats.EXACT_SEEDS} seeds, random patterns above"


def detectable(d: cells.Difference, level: float, significant: bool) -> tuple[float, float]:
    """(the MDE: the true difference a two-sided paired t-test at `level` detects with 80 % power at the observed
    SD of the per-seed differences; the power of that test to detect the observed difference, nan when it is
    significant), both from this comparison's own spread; nan with one seed."""
    n_seeds = len(d.seeds)
    mde = float(stats.minimum_detectable_effect(d.sd, n_seeds, level))
    return mde, math.nan if significant else stats.paired_t_power(d.difference, d.sd, n_seeds, level)


def seed_level_cells(d: cells.Difference, p_holm: float, alpha: float, mde_and_power: tuple[float, float]) -> list[str]:
    """The seed-level columns of a comparison as text, shared by `compare` and the `seeds` table; `mde_and_power`
    is what `detectable` gave when the comparison's family was built, printed here and not computed again."""
    floor = None if d.p_exact else d.p_floor
    mark = "†" if stats.significant(p_holm, alpha) else ""
    interval = "–" if d.ci_low != d.ci_low else f"[{d.ci_low:+.2f}, {d.ci_high:+.2f}]"
    mde_value, power_value = mde_and_power
    mde = "–" if mde_value != mde_value else f"{mde_value:.2f}"
    power = "–" if power_value != power_value else f"{power_value:.2f}"
    return [
        f"{d.difference:+.2f}",
        ", ".join(f"{x:+.2f}" for x in d.per_seed),
        interval,
        stats.format_p(d.p_value, floor),
        stats.format_p(d.p_floor, floor),
        stats.format_p(p_holm),
        mark,
        stats.format_p(d.p_t),
        mde,
        power,
    ]
