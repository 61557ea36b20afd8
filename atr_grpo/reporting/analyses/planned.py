"""The analysis an experiment's plan (`reporting.plan`) fixes, run on its runs: each planned comparison's
difference at the plan's endpoint, metric and benchmark, its test, its gatekept p, and what it supports.

Each comparison is `cells.compare` with the same random streams as `compare` and the tables. Its verdict:
- `differs`: its adjusted p is below α (for a secondary: the gate is open and Holm rejects);
- `equivalent within ±margin`: it does not differ and the paired TOST over the seeds, at the level its test uses,
  shows the difference inside the plan's margin;
- `not established`: neither (the power to detect the observed difference is printed beside it);
- `not tested`: a secondary when the primary did not reject (its numbers are shown, as exploration only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses import compare
from atr_grpo.reporting.plan import PRIMARY, SECONDARY, Comparison, Plan, PlanError, gatekept
from atr_grpo.reporting.runs import AVERAGE, Run, repeat_free

DIFFERS, EQUIVALENT, NOT_ESTABLISHED, NOT_TESTED = "differs", "equivalent", "not established", "not tested"
FINAL = "final"  # the endpoint of a plan's final evaluation: its one evaluated step


@dataclass(frozen=True)
class PlannedResult:
    model: str
    role: str  # PRIMARY or SECONDARY
    comparison: Comparison
    difference: cells.Difference
    p_value: float  # the plan's test, unadjusted
    p_adjusted: float  # the primary's own p; a secondary's max(p primary, Holm p)
    level: float  # the level its test uses (Plan.level): its MDE, power and TOST are at this level
    verdict: str  # DIFFERS, EQUIVALENT, NOT_ESTABLISHED or NOT_TESTED
    tost: stats.Tost
    mde: float
    power: float  # to detect the observed difference; nan when it differs
    metric: str = ""  # the metric tested, when not the plan's own (a `secondary_metrics` entry)
    evaluations: str = ""  # the plan's final evaluation folder, when the test reads it (at the final endpoint)

    @property
    def label(self) -> str:
        """The comparison, with its metric when that is not the plan's own, and the final evaluation it reads."""
        label = f"{self.comparison.label} ({self.metric})" if self.metric else self.comparison.label
        return f"{label} [{self.evaluations}, final]" if self.evaluations else label

    def describe(self) -> str:
        """The verdict in words, with the number that decides it."""
        margin = self.tost.margin
        if self.verdict == DIFFERS:
            side = "above" if self.difference.difference > 0 else "below"
            return f"differs: {self.comparison.a} {side} {self.comparison.b} (adjusted p {self.p_adjusted:.3g})"
        if self.verdict == EQUIVALENT:
            return f"equivalent within ±{margin:g} points (TOST p {self.tost.p_value:.3g})"
        if self.verdict == NOT_TESTED:
            return "not tested: the primary did not reject, so the gate to the secondaries is closed"
        return (
            f"not established: no difference shown, and TOST ±{margin:g} p {stats.format_p(self.tost.p_value)}; "
            f"power to detect {self.difference.difference:+.2f} was {self.power:.2f}"
        )


def analyse(runs: list[Run], plan: Plan, resampling: stats.Resampling) -> list[PlannedResult]:
    """Every planned comparison of each model of the plan's experiment; PlanError when the runs cannot answer it
    (a method, seed or benchmark the plan names is missing), naming what is missing."""
    kept = repeat_free(runs, lambda r: r.experiment == plan.experiment)
    if not kept:
        found = sorted({r.experiment for r in runs})
        raise PlanError(f"{plan.path}: no runs of experiment {plan.experiment!r} (found: {', '.join(found) or 'none'})")
    kept = _of_study(kept, plan)
    results = []
    for model in sorted({r.model for r in kept}):
        of_model = [r for r in kept if r.model == model]
        results += _analyse_model(of_model, plan, resampling)
    return results


def _analyse_model(runs: list[Run], plan: Plan, resampling: stats.Resampling) -> list[PlannedResult]:
    model, experiment = runs[0].model, plan.experiment
    benchmarks = list(dict.fromkeys(b for r in runs for b in r.benchmarks))
    if plan.benchmark != AVERAGE and plan.benchmark not in benchmarks:
        raise PlanError(f"{plan.path}: benchmark {plan.benchmark!r}; the runs evaluate {', '.join(benchmarks)}")
    # (role, comparison, metric, endpoint, the final evaluation's folder or "")
    hypotheses = [(role, comparison, metric, plan.endpoint, "") for role, comparison, metric in plan.hypotheses()]
    if plan.final_evaluation is not None:
        hypotheses.append((SECONDARY, plan.primary, plan.metric, FINAL, plan.final_evaluation.folder))
    differences, p_values = [], []
    for _, comparison, metric, endpoint, folder in hypotheses:
        sides = [_method_runs(runs, method, plan, folder) for method in (comparison.a, comparison.b)]
        experiment_key = f"{experiment}/{folder}" if folder else experiment  # its own random streams
        key = cells.comparison_key(experiment_key, model, comparison.a, comparison.b, metric, plan.benchmark, endpoint)
        try:
            scores = [cells.cell_scores(s, metric, plan.benchmark, benchmarks, endpoint) for s in sides]
            difference = cells.compare(*scores, resampling, key, (comparison.a, comparison.b))
        except cells.ScoreError as err:
            where = f" in {folder}/" if folder else ""
            raise PlanError(f"{plan.path}: {comparison.label} ({metric}){where} on {model}: {err}") from None
        differences.append(difference)
        p_values.append(difference.p_value if plan.test == "seed_sign_flip" else difference.p_t)
    p_primary, p_secondary, gate_open = gatekept(p_values[0], p_values[1:], plan.alpha)
    return [
        _result(model, role, comparison, difference, p, adjusted, plan, role == PRIMARY or gate_open, metric, folder)
        for (role, comparison, metric, _, folder), difference, p, adjusted in zip(
            hypotheses, differences, p_values, [p_primary, *p_secondary]
        )
    ]


def _of_study(runs: list[Run], plan: Plan) -> list[Run]:
    """The runs of the plan's study: the one it names, else the one study of its experiment's runs; PlanError when
    there are none, or several and the plan names none."""
    studies = sorted({r.study for r in runs})
    if plan.study is None and len(studies) > 1:
        raise PlanError(
            f"{plan.path}: the runs of experiment {plan.experiment!r} belong to several studies "
            f"({', '.join(studies)}), and a plan's methods are compared within one; name it with `study: NAME`"
        )
    chosen = [r for r in runs if plan.study in (None, r.study)]
    if not chosen:
        raise PlanError(
            f"{plan.path}: study {plan.study!r} has no runs of {plan.experiment} (studies: {', '.join(studies)})"
        )
    return chosen


def _method_runs(runs: list[Run], method: str, plan: Plan, folder: str = "") -> list[Run]:
    """The runs of `method`, which must be exactly the plan's seeds; with `folder`, each evaluated again there
    (`Run.evaluated_again`), and PlanError when a run has no such evaluation."""
    found = [r for r in runs if r.method == method]
    if folder:
        found = [r.evaluated_again(folder) for r in found]
        missing = [r.path.name for r in found if not r.summary]
        if missing:
            raise PlanError(
                f"{plan.path}: final_evaluation: no evaluation in {folder}/ of {', '.join(missing)}; "
                f"`python -m atr_grpo.final_eval --runs {runs[0].path.parent}` writes it"
            )
    if not found:
        methods = ", ".join(sorted({r.method for r in runs}))
        raise PlanError(f"{plan.path}: no runs of method {method!r} in study {runs[0].study} (methods: {methods})")
    seeds = {r.seed for r in found}
    if seeds != set(plan.seeds):
        missing, extra = sorted(set(plan.seeds) - seeds), sorted(seeds - set(plan.seeds))
        raise PlanError(
            f"{plan.path}: {method} has seeds {sorted(seeds)}, the plan {list(plan.seeds)} (missing: "
            f"{missing or '–'}; not in the plan: {extra or '–'})"
        )
    return found


def _result(
    model: str,
    role: str,
    comparison: Comparison,
    difference: cells.Difference,
    p_value: float,
    p_adjusted: float,
    plan: Plan,
    tested: bool,
    metric: str,
    folder: str = "",
) -> PlannedResult:
    level = plan.level(role)
    significant = tested and stats.significant(p_adjusted, plan.alpha)
    tost = stats.seed_tost(difference.per_seed, plan.equivalence_margin, level)
    mde, power = compare.detectable(difference, level, significant)
    if not tested:
        verdict = NOT_TESTED
    elif significant:
        verdict = DIFFERS
    else:
        verdict = EQUIVALENT if tost.equivalent else NOT_ESTABLISHED
    return PlannedResult(
        model=model,
        role=role,
        comparison=comparison,
        difference=difference,
        p_value=p_value,
        p_adjusted=p_adjusted,
        level=level,
        verdict=verdict,
        tost=tost,
        mde=mde,
        power=power,
        metric="" if metric == plan.metric else metric,
        evaluations=folder,
    )


def apply_to_rows(
    rows: list[compare.Row], method_a: str, method_b: str, results: list[PlannedResult], plan: Plan
) -> None:
    """Give each `compare A B` row that the plan tests the plan's family, adjusted p and level, and the MDE and
    power the plan's analysis found at that level."""
    family = list(dict.fromkeys(result.label for result in results))
    for row in rows:
        if (row.experiment, row.benchmark, row.endpoint) != (
            plan.study or plan.experiment,
            plan.benchmark,
            plan.endpoint,
        ):
            continue
        for result in results:
            if result.evaluations:  # the final evaluation's test: not a row of the runs' own evaluations
                continue
            tested = result.metric or plan.metric
            if (result.model, result.comparison, tested) == (row.model, Comparison(method_a, method_b), row.metric):
                row.p_holm, row.family, row.level, row.planned = result.p_adjusted, family, result.level, result
                row.detectable = (result.mde, result.power)


def planned_lines(results: list[PlannedResult], plan: Plan, commit: str) -> list[str]:
    """Markdown: the plan's comparisons, their tests and verdicts."""
    alpha, margin = plan.alpha, plan.equivalence_margin
    lines = [
        f"## Analysis plan: {plan.path.name} of {plan.experiment} (commit {commit[:12]})",
        "",
        f"{plan.metric} on {plan.benchmark} at the {plan.endpoint} endpoint; test: {plan.test}; α {alpha:g}; "
        f"the primary at α alone, the {plan.secondary_count} secondaries by Holm among themselves only if the "
        f"primary rejects (serial gatekeeping); equivalence margin ±{margin:g} points; seeds "
        f"{', '.join(map(str, plan.seeds))}.",
        *(
            [
                "",
                f"Final evaluation: {plan.final_evaluation.describe()} "
                f"(the row marked [{plan.final_evaluation.folder}, final]).",
            ]
            if plan.final_evaluation
            else []
        ),
        "",
        "| model | role | comparison | difference | 95% CI (t, seeds) | p | adjusted p | level | MDE (80%) "
        f"| power (observed) | TOST ±{margin:g} p | (1 − 2·level) CI (TOST) | verdict |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        d = r.difference
        power = "–" if math.isnan(r.power) else f"{r.power:.2f}"
        tost_ci = "–" if math.isnan(r.tost.low) else f"[{r.tost.low:+.2f}, {r.tost.high:+.2f}]"
        lines.append(
            f"| {r.model} | {r.role} | {r.label} | {d.difference:+.2f} | [{d.ci_low:+.2f}, "
            f"{d.ci_high:+.2f}] | {stats.format_p(r.p_value)} | {stats.format_p(r.p_adjusted)} | {r.level:.3g} "
            f"| {r.mde:.2f} | {power} | {stats.format_p(r.tost.p_value)} | {tost_ci} | {r.describe()} |"
        )
    return lines
