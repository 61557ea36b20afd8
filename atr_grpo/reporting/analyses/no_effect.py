"""When a comparison cannot show anything, say so: the runs are identical, or a rule never acted.

- Identical runs: two runs gave the same evaluations (every summary metric, and every sample's completion and
  verdict, at every step and benchmark) and the same training metrics (every metric both log, `OUTCOME_SKIP`
  aside: timings and the echoes of a setting). Two methods whose runs are identical for every seed cannot
  differ in any test; when they differ in one setting only, that swept value had no effect.
- Identical evaluations: two runs drew byte-identical evaluation samples (completions and verdicts; the summary's
  metrics where a per-sample file is gone) at every step and benchmark, while their training metrics differ. For
  every seed, no test can show a difference either, and the likely cause is a run too short for the rules to
  change what the policy samples.
- A rule that never acted: its act metric (`ClipRule.act_metric`, `clip/frac` unless the rule declares another)
  is 0 at every logged step of the run's metrics.jsonl, so its bounds never bound. A rule that declares none
  (a soft gate, a penalty: it freezes no token) is never reported.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations
from typing import Any

from atr_grpo import rundir
from atr_grpo.evaluation.outputs import find_sample_file
from atr_grpo.reporting.cells import seed_pairs
from atr_grpo.reporting.metric import Metric
from atr_grpo.reporting.runs import Run, metric_number, varying_keys

# what two runs of one outcome may still log differently: timings, labels, and settings echoed per step
OUTCOME_SKIP = ("method", "learning_rate", "clip/delta", "step_time", "generate_s", "grade_s", "time_s")
SAMPLE_FIELDS = ("problem_id", "sample", "completion", "correct")


def _outcome(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in OUTCOME_SKIP}


def _same_metrics(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """One logged step of two runs agrees on every metric both log (a rule's own extras, e.g. clip/frac_dual, are
    logged by one side only)."""
    return all(a[k] == b[k] for k in set(a) & set(b) if k not in OUTCOME_SKIP)


def _samples(run: Run, step: int, benchmark: str) -> list[tuple[Any, ...]] | None:
    path = find_sample_file(run.path, step, benchmark)
    if path is None:
        return None
    return [tuple(r.get(f) for f in SAMPLE_FIELDS) for r in rundir.iter_jsonl(path, whole=True)]


def same_samples(a: Run, b: Run, step: int, benchmark: str) -> bool | None:
    """Whether one evaluation of two runs drew the same samples (completions, verdicts) in the same order; None
    when either run has no per-sample file for it."""
    samples = [_samples(run, step, benchmark) for run in (a, b)]
    return None if None in samples else samples[0] == samples[1]


def _scores(row: dict[str, Any]) -> dict[str, Any]:
    """A summary line's scores (`mean@8`, `pass@8`, ...): what its samples and verdicts give."""
    return {key: value for key, value in row.items() if Metric.is_name(key)}


def same_evaluations(a: Run, b: Run) -> bool:
    """Whether two runs evaluated the same steps and benchmarks and drew the same samples with the same verdicts
    at each: the per-sample files decide, and the summary's metrics where either side has none."""
    if not a.summary or set(a.summary) != set(b.summary):
        return False
    if any(_scores(a.summary[key]) != _scores(b.summary[key]) for key in a.summary):
        return False  # the samples' scores differ: no sample file need be read
    for key in a.summary:
        same = same_samples(a, b, *key)
        if same is False or (same is None and _outcome(a.summary[key]) != _outcome(b.summary[key])):
            return False
    return True


def _same_training(a: Run, b: Run) -> bool:
    return len(a.metrics) == len(b.metrics) and all(map(_same_metrics, a.metrics, b.metrics))


def identical(a: Run, b: Run) -> bool:
    """Whether two runs gave the same evaluations and training metrics (see the module's docstring)."""
    return same_evaluations(a, b) and _same_training(a, b)


def act_metric(run: Run) -> str | None:
    """The metric that shows whether the run's rule acted; None when its rule declares none."""
    from atr_grpo.clipping import RULES

    rule = RULES.get(str(run.clipping.get("name")))
    return "clip/frac" if rule is None else rule.act_metric


def never_acted(run: Run) -> str | None:
    """The act metric, when it is logged and 0 at every step of the run; None when the rule acted (or cannot tell)."""
    metric = act_metric(run)
    if metric is None:
        return None
    values = [v for row in run.metrics if (v := metric_number(row.get(metric))) is not None]
    return metric if values and not any(values) else None


def _seeds(seeds: list[int]) -> str:
    return f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"


def _differing(a: Run, b: Run) -> list[str]:
    """The settings in which two runs differ (the config's method label aside)."""
    return [k for k in varying_keys([a, b]) if k != "method"]


def evaluations_alike(runs_a: list[Run], runs_b: list[Run]) -> bool:
    """Whether every seed pair of A and B drew the same evaluation samples: no test can tell them apart."""
    pairs = seed_pairs(runs_a, runs_b)
    return bool(pairs) and all(same_evaluations(a, b) for a, b in pairs)


def drew_alike(runs_a: list[Run], runs_b: list[Run]) -> list[int]:
    """The seeds of A against B when every seed drew the same evaluation samples though training differed in
    some; [] otherwise."""
    if not evaluations_alike(runs_a, runs_b):
        return []
    pairs = seed_pairs(runs_a, runs_b)
    return [] if all(_same_training(a, b) for a, b in pairs) else [a.seed for a, _ in pairs]


def pair_warnings(runs_a: list[Run], runs_b: list[Run]) -> list[str]:
    """What A against B cannot show: runs identical for some or every seed (and the one setting that had no
    effect, when they differ in one only)."""
    method_a, method_b = runs_a[0].method, runs_b[0].method
    seeds = drew_alike(runs_a, runs_b)
    if seeds:
        return [_same_samples_line([method_a, method_b], seeds, runs_a[0].max_steps)]
    pairs = seed_pairs(runs_a, runs_b)
    same = [a.seed for a, b in pairs if identical(a, b)]
    if not same:
        return []
    if len(same) < len(pairs):
        return [f"identical: {method_a} and {method_b} gave the same runs for {_seeds(same)}"]
    line = (
        f"identical: {method_a} and {method_b} gave the same evaluations and training metrics for every seed "
        f"({_seeds(same)}), so no test can show a difference"
    )
    a, b = pairs[0]
    differing = _differing(a, b)
    if len(differing) == 1:
        key = differing[0]
        shown = ", ".join(rundir.setting_text(key, r.settings.get(key)) for r in (a, b))
        line += f"; they differ only in {key} ({shown}): the swept value had no effect"
    return [line]


def _same_samples_line(methods: list[str], seeds: list[int], max_steps: int | None) -> str:
    """Every seed drew the same evaluation samples, though training differed: the likely cause is a short run."""
    steps = f" ({max_steps} steps)" if max_steps else ""
    return (
        f"identical evaluations: {_and(methods)} drew byte-identical evaluation samples for every seed "
        f"({_seeds(seeds)}), though their training metrics differ, so no test can show a difference and no MDE "
        f"is given; likely cause: too few training steps{steps} for the rules to act on what the policy samples"
    )


def _and(names: list[str]) -> str:
    return " and ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} and {names[-1]}"


def rule_warnings(runs: list[Run]) -> list[str]:
    """One line per method whose rule never acted in some of its runs, naming the metric and the seeds."""
    quiet: dict[tuple[str, str], list[int]] = defaultdict(list)
    for run in sorted(runs, key=lambda r: r.seed):
        metric = never_acted(run)
        if metric is not None:
            quiet[(run.method, metric)].append(run.seed)
    return [
        f"never acted: the rule of {method} never acted ({metric} is 0 at every logged step of {_seeds(seeds)})"
        for (method, metric), seeds in sorted(quiet.items())
    ]


def study_warnings(runs: list[Run], ties_only: bool = False) -> list[str]:
    """For the tables: per study and model, each pair of methods whose runs are identical, each set of methods
    that drew the same evaluation samples (one line for them all, not one per pair), and each rule that never
    acted, as `<study>/<model>: <what>`. With `ties_only`, only the methods whose runs are alike for every seed of
    both: their rows in a table are ties, which a table's notes explain."""
    groups: dict[tuple[str, str], dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run.config and run.is_training:
            groups[(run.study, run.model)][run.method].append(run)
    lines = []
    for (study, model), methods in sorted(groups.items()):
        alike: dict[tuple[int, ...], list[set[str]]] = defaultdict(list)
        found = []
        for a, b in combinations(sorted(methods), 2):
            if ties_only and not (_same_seeds(methods[a], methods[b]) and evaluations_alike(methods[a], methods[b])):
                continue
            seeds = drew_alike(methods[a], methods[b])
            if seeds:
                _join(alike[tuple(seeds)], {a, b})
            else:
                found += pair_warnings(methods[a], methods[b])
        for seeds, sets in alike.items():
            for names in sets:
                first = sorted(names)
                found.append(_same_samples_line(first, list(seeds), methods[first[0]][0].max_steps))
        if not ties_only:
            found += rule_warnings([run for group in methods.values() for run in group])
        lines += [f"{study}/{model}: {line}" for line in found]
    return lines


def _same_seeds(runs_a: list[Run], runs_b: list[Run]) -> bool:
    return sorted(run.seed for run in runs_a) == sorted(run.seed for run in runs_b)


def _join(sets: list[set[str]], pair: set[str]) -> None:
    """Add a pair of methods to the sets it meets (merging them), or as a set of its own."""
    met = [names for names in sets if names & pair]
    for names in met:
        sets.remove(names)
    sets.append(set().union(pair, *met))
