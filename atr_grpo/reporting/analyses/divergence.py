"""Where two runs part: `python -m atr_grpo.results diverge RUN_A RUN_B`.

For runs expected to be the same run (ATR under min semantics against clip_higher at ATR's exact box, Thm
4.1–4.2), this reports the largest difference in every evaluation and training metric that differs, and where they
first differ: the first optimizer step whose logged metrics differ (and which metrics), the first evaluation step
and benchmark whose samples differ (or, without per-sample files, whose summary metrics do), and there the first
sample whose completion differs, with the character at which the two texts part; evaluations that never part are
named identical, with their steps. Byte-identical samples never
part, whatever their summary lines' metadata say; a line's `seed` (a training run's own seed) is not compared,
and the seeds the samples were drawn with (`Run.drawn_seed`) are named when they differ. Training metrics are
logged per optimizer step, so the step is as fine as the files allow; the per-token ratios of training are not
saved. Runs of unequal length (one cut off, or not finished) are never "identical": the steps, evaluations and
DONE record that only one of them has are named.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from atr_grpo import rundir
from atr_grpo.evaluation.outputs import find_sample_file
from atr_grpo.reporting.analyses.no_effect import OUTCOME_SKIP, same_samples
from atr_grpo.reporting.runs import DRAWN_SEED, DRAWN_SEED_FALLBACK, Run, metric_number
from atr_grpo.rundir import layout, records


@dataclass
class Divergence:
    largest: dict[str, float] = field(default_factory=dict)  # metric → largest |A − B| over steps
    first_training_step: int | None = None
    first_training_metrics: list[str] = field(default_factory=list)
    first_evaluation: tuple[int, str] | None = None  # (step, benchmark)
    first_sample: dict[str, Any] | None = None  # problem_id, sample, offset, the two texts from there
    unequal: list[str] = field(default_factory=list)  # what only one run has: steps, evaluations, DONE
    seed_notes: list[str] = field(default_factory=list)  # drawn seeds that differ, and lines that do not record them
    evaluation_steps: list[int] = field(default_factory=list)  # the steps both runs evaluated
    same_evaluations: bool = True  # both runs evaluated the same steps and benchmarks

    @property
    def identical(self) -> bool:
        return self.first_training_step is None and self.first_evaluation is None and not self.unequal


# what a summary line says of its run, or of the seed it drew with (compared apart, `_seed_notes`)
NOT_COMPARED = ("step", "seed", DRAWN_SEED)


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    values = {k: metric_number(v) for k, v in record.items() if k not in OUTCOME_SKIP and k not in NOT_COMPARED}
    return {k: v for k, v in values.items() if v is not None and math.isfinite(v)}


def _note_largest(largest: dict[str, float], prefix: str, a: dict[str, float], b: dict[str, float]) -> list[str]:
    """Record |a − b| per shared metric under `prefix`; the metrics that differ."""
    differ = []
    for key in sorted(set(a) & set(b)):
        gap = abs(a[key] - b[key])
        largest[prefix + key] = max(largest.get(prefix + key, 0.0), gap)
        if gap:
            differ.append(key)
    return differ


def _first_sample(a: Run, b: Run, step: int, benchmark: str) -> dict[str, Any] | None:
    files = [find_sample_file(run.path, step, benchmark) for run in (a, b)]
    if None in files:
        return None
    for left, right in zip(*(rundir.iter_jsonl(f, whole=True) for f in files), strict=False):
        text_a, text_b = str(left.get("completion")), str(right.get("completion"))
        if text_a != text_b:
            offset = next((i for i, (x, y) in enumerate(zip(text_a, text_b, strict=False)) if x != y), None)
            offset = min(len(text_a), len(text_b)) if offset is None else offset
            return {
                "problem_id": left.get("problem_id"),
                "sample": left.get("sample"),
                "offset": offset,
                "a": text_a[offset : offset + 40],
                "b": text_b[offset : offset + 40],
            }
    return None


def _listed(items: list[Any], show: Callable[[Any], str] = str) -> str:
    """`1, 2, 3, …, 128 (128)`: the first three, the last and how many."""
    shown = ", ".join(show(item) for item in items[:3]) + (f", …, {show(items[-1])}" if len(items) > 3 else "")
    return f"{shown} ({len(items)})"


def _only_in(what: str, a: list[Any], b: list[Any], show: Callable[[Any], str] = str) -> list[str]:
    """Lines naming the items of `a` not in `b`, and of `b` not in `a`."""
    lines = []
    for side, mine, theirs in (("A", a, b), ("B", b, a)):
        only = sorted(set(mine) - set(theirs))
        if only:
            lines.append(f"{what} only in {side}: {_listed(only, show)}")
    return lines


def _done_text(done: records.Done | None) -> str:
    return f"{layout.DONE_FILE} at step {done.step}" if done is not None else f"no {layout.DONE_FILE}"


def unequal_lengths(a: Run, b: Run) -> list[str]:
    """What one run has and the other lacks: logged optimizer steps, evaluations (step, benchmark), and the DONE
    record of a finished run (or DONE at another step)."""
    lines = _only_in("training steps", *([int(row["step"]) for row in run.metrics] for run in (a, b)))
    lines += _only_in("evaluations", *(list(run.summary) for run in (a, b)), lambda key: f"step {key[0]} {key[1]}")
    done = [records.read_done(run.path) for run in (a, b)]
    if len({None if d is None else d.step for d in done}) > 1:
        lines.append(f"{layout.DONE_FILE}: A has {_done_text(done[0])}, B has {_done_text(done[1])}")
    return lines


def divergence(a: Run, b: Run) -> Divergence:
    """Where runs `a` and `b` first differ, and their largest difference in every metric."""
    found = Divergence(unequal=unequal_lengths(a, b))
    steps_b = {row.get("step"): row for row in b.metrics}
    for row in a.metrics:
        other = steps_b.get(row.get("step"))
        if other is None:
            continue
        differ = _note_largest(found.largest, "train/", _numbers(row), _numbers(other))
        if differ and found.first_training_step is None:
            found.first_training_step, found.first_training_metrics = int(row["step"]), differ
    for key in sorted(set(a.summary) & set(b.summary)):
        step, benchmark = key
        differ = _note_largest(found.largest, f"eval/{benchmark}/", _numbers(a.summary[key]), _numbers(b.summary[key]))
        if found.first_evaluation is not None:
            continue  # only the largest differences are still wanted: no more sample files to read
        same = same_samples(a, b, step, benchmark)
        if same is False or (same is None and differ):
            found.first_evaluation, found.first_sample = key, _first_sample(a, b, step, benchmark)
    found.seed_notes = _seed_notes(a, b, sorted(set(a.summary) & set(b.summary)))
    found.evaluation_steps = sorted({step for step, _ in set(a.summary) & set(b.summary)})
    found.same_evaluations = set(a.summary) == set(b.summary)
    return found


def _seed_notes(a: Run, b: Run, keys: list[tuple[int, str]]) -> list[str]:
    """The evaluations whose samples were drawn with other seeds, and the runs whose lines do not record them."""
    notes, unrecorded = [], set()
    for step, benchmark in keys:
        (seed_a, kept_a), (seed_b, kept_b) = (run.drawn_seed(step, benchmark) for run in (a, b))
        unrecorded |= {label for label, kept in (("A", kept_a), ("B", kept_b)) if not kept}
        if seed_a != seed_b:
            notes.append(f"drawn seed differs at step {step}, {benchmark}: A {seed_a!r}, B {seed_b!r}")
    return notes + [f"{label}: {DRAWN_SEED_FALLBACK}" for label in sorted(unrecorded)]


def report(a: Run, b: Run, found: Divergence) -> str:
    lines = [f"A: {a.path}", f"B: {b.path}"]
    if found.identical:
        lines.append("identical: every shared training metric, evaluation metric and sample agrees")
    elif found.unequal:
        lines.append("unequal lengths: " + "; ".join(found.unequal))
    if found.first_training_step is not None:
        shown = ", ".join(found.first_training_metrics[:6])
        lines.append(f"training parts at optimizer step {found.first_training_step} ({shown})")
    if found.first_evaluation is None and found.evaluation_steps and not found.identical:
        which = "evaluations" if found.same_evaluations else "the evaluations both runs have"
        steps = found.evaluation_steps
        lines.append(f"{which}: identical (step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))})")
    if found.first_evaluation is not None:
        step, benchmark = found.first_evaluation
        lines.append(f"evaluation parts at step {step}, {benchmark}")
        if found.first_sample is not None:
            s = found.first_sample
            lines.append(
                f"  first differing sample: problem {s['problem_id']}, sample {s['sample']}, from character "
                f"{s['offset']}: A {s['a']!r} / B {s['b']!r}"
            )
    lines += [f"note: {line}" for line in found.seed_notes]
    differ = {key: gap for key, gap in found.largest.items() if gap}  # a metric that agrees says nothing here
    rows = [f"| {key} | {gap:.3g} |" for key, gap in sorted(differ.items()) if key.startswith("eval/")]
    worst = sorted(((gap, key) for key, gap in differ.items() if key.startswith("train/")), reverse=True)
    rows += [f"| {key} | {gap:.3g} |" for gap, key in worst[:8]]
    if rows:
        lines += ["", "| metric | largest abs. difference |", "|---|---:|", *rows]
    return "\n".join(lines) + "\n"
