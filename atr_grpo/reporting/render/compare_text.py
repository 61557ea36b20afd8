"""`compare`'s text: the Markdown of `compare A B` (the seed-level and robust tables, the notes of each study
and model, how the numbers were computed) and of `compare --eval` (the two folders, their table, the settings in
which they differ). The numbers come from `analyses/compare.py` and `analyses/eval_compare.py`; here they are
only written."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses.compare import SEED_TEST, Row, seed_design_note
from atr_grpo.reporting.analyses.eval_compare import EvalRow, Side
from atr_grpo.reporting.analyses.gates import noise_share_interval
from atr_grpo.reporting.analyses.parts import Split
from atr_grpo.reporting.runs import DRAWN_SEED_FALLBACK


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
        cells_ = seed_level_cells(r.difference, r.p_holm, alpha, r.detectable, alike=r.alike)
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
        shown = (
            ["–"] * 3  # the same samples on both sides: ½, [½, ½] and p = 1 would read as evidence of no difference
            if r.alike
            else [
                f"{d.improvement:.2f}",
                f"[{d.improvement_low:.2f}, {d.improvement_high:.2f}]",
                stats.format_p(d.p_problems, d.p_problems_floor),
            ]
        )
        lines.append(
            f"| {r.benchmark} | {r.metric} | {d.iqm_a:.2f} | {d.iqm_b:.2f} | {' | '.join(shown)} | {d.problems} |"
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
            lines.append(_noise_note(r))
    flat = [f"{r.benchmark} {r.metric}" for r in block if r.difference.no_spread]
    if flat:
        lines.append(
            f"No spread: the per-seed differences of {', '.join(flat)} are all equal (within "
            f"{cells.SPREAD_TOLERANCE:g} points), so their t-interval, paired t-test and MDE are not shown (–): equal "
            "differences over a few seeds do not make a difference exact."
        )
    if block[0].seeds_left_out:
        lines.append(
            f"Paired on the seeds both methods have ({', '.join(map(str, block[0].difference.seeds))}); left out: "
            f"{block[0].seeds_left_out}. The tables give this pair no test: they pair only methods with the same seeds."
        )
    lines.append(f"Seeds: {seed_design_note([len(r.difference.seeds) for r in block], resampling, alpha)}.")
    lines.append("")
    return lines


def _noise_note(r: Row) -> str:
    """A cell's evaluation noise beside the seed SD of its differences, and the noise share (reported, not a gate)."""
    share, low, high = noise_share_interval(r.evaluation_sd, float(r.difference.sd), len(r.difference.seeds))
    shown = "–" if math.isnan(share) else f"{100 * share:.0f} % [{100 * low:.0f} %, {100 * high:.0f} %] (95 % χ²)"
    return (
        f"{r.benchmark} {r.metric}: evaluation noise of a seed's difference {r.evaluation_sd:.2f} points (the draws "
        f"alone, from the paired samples' spread), seed SD of the differences {r.difference.sd:.2f}: the noise is "
        f"{shown} of their variance (reported, not a gate)."
    )


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


def seed_level_cells(
    d: cells.Difference, p_holm: float, alpha: float, mde_and_power: tuple[float, float], alike: bool = False
) -> list[str]:
    """The seed-level columns of a comparison as text, shared by `compare` and the `seeds` table; `mde_and_power`
    is what `detectable` gave when the comparison's family was built, printed here and not computed again. `alike`:
    both methods drew the same samples for every seed, so no test applies and its p-values print as –."""
    if alike:
        p_holm = float("nan")
        d = replace(d, p_value=float("nan"), p_t=float("nan"))
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


# ------------------------------------------------------------------------------------------ what a gain is made of
def format_parts(
    rows: list[Row], found: list[Split], method_a: str, method_b: str, resampling: stats.Resampling
) -> str:
    """Markdown: per (study, model), the seed-level table of Mean@K's parts (`analyses/parts.py`), secondary
    endpoints, then one line per Mean@K row splitting its difference between the answered rate and the accuracy."""
    level, alpha = f"{100 * resampling.confidence:g}%", 1 - resampling.confidence
    lines = []
    for experiment, model in dict.fromkeys((r.experiment, r.model) for r in rows + found):  # type: ignore[operator]
        block = [r for r in rows if (r.experiment, r.model) == (experiment, model)]
        lines += [
            f"## What {method_a} − {method_b} is made of: {experiment}, {model} (secondary endpoints)",
            "",
            f"| benchmark | metric | {method_a} | {method_b} | difference | per seed | {level} CI (t, seeds) "
            "| p (seeds) | smallest p | p (Holm) | † | p (paired t) | MDE (80%) | power (observed) |",
            "|---|---|---:|---:|---:|---|---|---:|---:|---:|:-:|---:|---:|---:|",
        ]
        for r in block:
            cells_ = seed_level_cells(r.difference, r.p_holm, alpha, r.detectable)
            lines.append(f"| {r.benchmark} | {r.metric} | {r.mean_a:.2f} | {r.mean_b:.2f} | {' | '.join(cells_)} |")
        lines.append("")
        lines += [split_line(s, method_a, method_b) for s in found if (s.experiment, s.model) == (experiment, model)]
        lines.append("")
    lines.append(
        "answered@K: the share of the first K samples with an extracted answer; acc_given_answer@K: the correct "
        "ones among those answered, Σ correct / Σ answered over the problems of each evaluation (a run's AUC is "
        "the mean of its steps' ratios); truncated@K: the share that ran out of tokens. Mean@K = answered@K × "
        "acc_given_answer@K at each evaluation. Each part is tested as Mean@K is, over the seed pairs, with the "
        "Holm family of its own column; they are secondary endpoints, and the accuracy given an answer, a ratio, "
        "has no problem-level test. The split: the change from B's (answered rate, accuracy) to A's, taken for "
        "each seed pair at each evaluation and benchmark, then averaged as Mean@K is; the two parts of either "
        "order add up to the difference."
    )
    return "\n".join(lines) + "\n"


def split_line(s: Split, method_a: str, method_b: str) -> str:
    """One Mean@K difference split, both orders, in points and in percent of the difference."""

    def share(value: float) -> str:
        return "" if s.difference == 0 or value != value else f" ({100 * value / s.difference:.0f} %)"

    first, then = s.answered_first
    accuracy, answered = s.accuracy_first
    return (
        f"{s.benchmark} {s.metric}: of {method_a} − {method_b} = {s.difference:+.2f} points, answered rate first: "
        f"the answered rate {first:+.2f}{share(first)}, then the accuracy given an answer {then:+.2f}{share(then)}; "
        f"accuracy first: the accuracy given an answer {accuracy:+.2f}{share(accuracy)}, then the answered rate "
        f"{answered:+.2f}{share(answered)}."
    )


# ------------------------------------------------------------------------------------------ compare --eval
# summary fields that say how the samples were made and graded: a difference is named in a note (and the seed
# they were drawn with, `Run.drawn_seed`; a line's `seed` is the run's seed in a training run)
SETTINGS = ("n", "temperature", "top_p", "top_k", "max_tokens", "prompt_hash", "enable_thinking", "grader")


class EvalCompareError(ValueError):
    pass


SAYS_WHAT = (
    "this model vs that model on these problems: a paired test over the problems both evaluated, each problem's "
    "score matched by id. It is not a claim about training methods: one run per side measures no spread over "
    "training seeds (`results compare A B` tests methods over seeds)."
)


def describe(side: Side) -> str:
    """One folder of `compare --eval`: its path, step, model and adapter."""
    first: dict[str, Any] = next(row for (step, _), row in side.run.summary.items() if step == side.step)
    model = first.get("model", side.run.model)
    adapter = first.get("adapter") or "no adapter"
    return f"{side.label}: {side.run.path} (step {side.step}; model {model}, {adapter})"


def format_eval_rows(a: Side, b: Side, rows: list[EvalRow], resampling: stats.Resampling) -> str:
    """Markdown: the two folders, what the comparison says, A − B per benchmark and metric, how it was computed."""
    level = f"{100 * resampling.confidence:g}%"
    lines = [
        describe(a),
        describe(b),
        "",
        SAYS_WHAT,
        "",
        f"| benchmark | metric | problems | A | B | A − B | {level} CI (problems) | p (sign flip, problems) "
        "| p (Holm) |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    floor = 1.0 / (resampling.resamples + 1)
    for r in rows:
        lines.append(
            f"| {r.benchmark} | {r.metric} | {r.problems} | {r.mean_a:.2f} | {r.mean_b:.2f} | {r.difference:+.2f} | "
            f"[{r.low:+.2f}, {r.high:+.2f}] | {stats.format_p(r.p_value, floor)} | {stats.format_p(r.p_holm, floor)} |"
        )
    lines += [
        "",
        f"Scores in percent. Interval: {resampling.describe()}. p: two-sided sign-flip test of the per-problem "
        f"differences, {resampling.resamples:,} random sign patterns; Holm over the rows above.",
    ]
    return "\n".join(lines) + "\n"


def setting_notes(a: Side, b: Side) -> list[str]:
    """A note per sampling or grading setting in which the two evaluations differ, the drawn seed included; and a
    note per side whose summary lines do not record their drawn seed (`Run.drawn_seed`)."""
    notes, unrecorded = [], set()
    for (step_a, name), row_a in sorted(a.run.summary.items()):
        row_b = b.run.summary.get((b.step, name))
        if step_a != a.step or row_b is None:
            continue
        for setting in SETTINGS:
            if row_a.get(setting) != row_b.get(setting):
                notes.append(f"note: {name}: {setting} differs (A {row_a.get(setting)!r}, B {row_b.get(setting)!r})")
        (seed_a, kept_a), (seed_b, kept_b) = (side.run.drawn_seed(side.step, name) for side in (a, b))
        unrecorded |= {side.label for side, kept in ((a, kept_a), (b, kept_b)) if not kept}
        if seed_a != seed_b:
            notes.append(f"note: {name}: drawn seed differs (A {seed_a!r}, B {seed_b!r})")
    return notes + [f"note: {label}: {DRAWN_SEED_FALLBACK}" for label in sorted(unrecorded)]
