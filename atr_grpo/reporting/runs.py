"""Run directories as the tables and figures see them: config, training metrics and evaluation summaries.

Everything here reads files only (contracts §3); nothing is recomputed from models. A run whose evaluations
are incomplete keeps its place in the tables and carries a list of `problems`, in words, so that the output
can say what is missing instead of silently dropping it. A run read with `grader=TAG` takes its summaries and
verdicts from `eval/regrade/TAG/` (written by `python -m atr_grpo.results regrade`) instead of the originals.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.evaluation.metrics import summarize
from atr_grpo.evaluation.outcomes import outcome_parts
from atr_grpo.evaluation.outputs import find_sample_file, read_summary, read_summary_file
from atr_grpo.evaluation.sampling import step_seed
from atr_grpo.evaluation.schedule import read_failures
from atr_grpo.reporting import regrade
from atr_grpo.reporting.metric import Metric
from atr_grpo.rundir import layout, records

AVERAGE = "average"
DRAWN_SEED = "drawn_seed"  # a summary line's field: the seed its samples were drawn with
# what a note says when a summary line lacks `drawn_seed` (`Run.drawn_seed`)
DRAWN_SEED_FALLBACK = (
    "written before summary lines recorded drawn_seed: its drawn seed is taken from "
    f"{layout.CONFIG_FILE}'s eval.seed (with eval.seed_by_step, its step's seed), else from the line's seed"
)


class MissingSamples(LookupError):
    """A per-sample file a computation needs is absent (the message names it)."""


class UndefinedScore(MissingSamples):
    """The samples are there but do not define the score: the accuracy given an answer with no answered sample."""


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # what is missing, in words (reported, never dropped)
    grader: str | None = None  # a regrade tag: read eval/regrade/<tag>/ instead of the original verdicts
    label: str | None = None  # the method's name (`name_methods`); None: the config's label
    launch: dict[str, Any] = field(default_factory=dict)  # env.json: the launch's command line and start time
    # a folder inside the run whose eval/ is read instead of the run's own (a plan's final evaluation); None: eval/
    evaluations: str | None = None
    _cache: dict[tuple, Any] = field(default_factory=dict, repr=False, compare=False)

    def _section(self, name: str) -> dict[str, Any]:
        value = self.config.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def eval_root(self) -> Path:
        """The folder whose eval/ holds this run's evaluations: the run's own, or its `evaluations` folder."""
        return self.path if self.evaluations is None else self.path / self.evaluations

    def evaluated_again(self, folder: str) -> Run:
        """This training run, its evaluations read from `<run>/<folder>/eval/` (written by `atr_grpo.final_eval`):
        the same method, seed and settings, so its comparisons pair as the run's own do."""
        run = Run(self.path, self.config, grader=self.grader, label=self.label, launch=self.launch, evaluations=folder)
        if not run.summary:
            run.problems.append(f"no evaluation in {folder}/ (python -m atr_grpo.final_eval writes it)")
        return run

    @property
    def experiment(self) -> str:
        return str(self.config.get("experiment", "?"))

    @property
    def study(self) -> str:
        """The runs this one is compared with: its config's `study`, else its experiment."""
        return rundir.study_of(self.config)

    @property
    def scope(self) -> str:
        """The `experiment` column of the per-run tables: the experiment, with its study after " / " when the
        study has a name of its own."""
        return self.experiment if self.study == self.experiment else f"{self.experiment} / {self.study}"

    @property
    def model(self) -> str:
        return str(self._section("model").get("name", "?"))

    @property
    def method(self) -> str:
        """The method's name: the rule and its non-default parameters, plus the settings its launch changed
        (`name_methods`), e.g. `clip · trainer.learning_rate=0.001`."""
        return self.label or self.base_method

    @property
    def base_method(self) -> str:
        """The config's own label (`rundir.method_label`: the rule and its non-default parameters)."""
        return str(self.config.get("method") or self.clipping.get("name", "?"))

    @cached_property
    def settings(self) -> dict[str, Any]:
        """{dotted key: value} of the settings that define the run's method (`rundir.method_settings`)."""
        return rundir.method_settings(self.config)

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def key(self) -> tuple[str, str, str, int]:
        """Runs with the same key are repeats of one point (not extra seeds): same study, model, settings and seed."""
        return (self.study, self.model, json.dumps(self.settings, sort_keys=True, default=str), self.seed)

    @property
    def is_training(self) -> bool:
        """A training run (it has a trainer section); else a standalone evaluation."""
        return bool(self._section("trainer"))

    @property
    def credit_inside_think(self) -> bool:
        """The run's eval.credit_inside_think (False for runs from before the setting, which is its default)."""
        return self._section("eval").get("credit_inside_think") is True

    @property
    def clipping(self) -> dict[str, Any]:
        return self._section("clipping")

    @property
    def benchmarks(self) -> list[str]:
        return [str(b) for b in self._section("eval").get("benchmarks", [])]

    @property
    def k(self) -> int:
        return int(self._section("eval").get("k", 8))

    @property
    def max_steps(self) -> int | None:
        value = self._section("trainer").get("max_steps")
        return None if value is None else int(value)

    @property
    def expected_eval_steps(self) -> list[int] | None:
        """The steps a finished training run evaluates (its `Schedule`). None for standalone evaluations."""
        from atr_grpo.evaluation.schedule import Schedule

        schedule = Schedule.of(self._section("eval"))
        if self.evaluations is not None or self.max_steps is None or schedule is None:
            return None
        return schedule.steps(self.max_steps)

    @cached_property
    def summary(self) -> dict[tuple[int, str], dict[str, Any]]:
        if self.grader is None:
            return read_summary(self.eval_root, whole=True)
        return read_summary_file(regrade.summary_path(self.eval_root, self.grader), whole=True)

    def drawn_seed(self, step: int, benchmark: str) -> tuple[Any, bool]:
        """(the seed one evaluation's samples were drawn with, whether its summary line records it). A line from
        before `drawn_seed` gives the config's eval.seed (its step's `step_seed` under eval.seed_by_step), else the
        line's `seed`: in a training run's line that is the run's seed, not the evaluation's."""
        row = self.summary[(step, benchmark)]
        if DRAWN_SEED in row:
            return row[DRAWN_SEED], True
        evaluation = self._section("eval")
        if "seed" not in evaluation:
            return row.get("seed"), False
        seed = int(evaluation["seed"])
        return (step_seed(seed, step) if evaluation.get("seed_by_step") else seed), False

    def verdicts(self, step: int, benchmark: str) -> dict[str, list[bool]]:
        """{problem id: verdicts in sample order} of one evaluation, from its per-sample file (or, with a
        grader tag, the regraded verdicts). Raises MissingSamples naming the file that is absent."""
        return self._samples(step, benchmark)[0]

    def statuses(self, step: int, benchmark: str) -> dict[str, list[str]]:
        """{problem id: grader statuses in sample order} (`evaluation.outcomes`), from the file `verdicts` reads.
        Raises MissingSamples when the file is absent or was written before statuses were recorded."""
        statuses = self._samples(step, benchmark)[1]
        if statuses is None:
            raise MissingSamples(f"{self.path}: step {step}, {benchmark}: the per-sample file records no status")
        return statuses

    def _samples(self, step: int, benchmark: str) -> tuple[dict[str, list[bool]], dict[str, list[str]] | None]:
        """(verdicts, statuses or None when a record lacks one) of one evaluation, read once."""
        key = ("samples", step, benchmark)
        if key not in self._cache:
            if self.grader is None:
                path = find_sample_file(self.eval_root, step, benchmark)
                wanted = f"{layout.sample_file('', step, benchmark)}(.gz)"
            else:
                path = regrade.verdict_file(self.eval_root, self.grader, step, benchmark)
                wanted, path = str(path.relative_to(self.eval_root)), path if path.exists() else None
            if path is None:
                raise MissingSamples(f"{self.eval_root}: no per-sample file {wanted}")
            by_problem: dict[str, dict[int, tuple[bool, str | None]]] = defaultdict(dict)
            for record in rundir.iter_jsonl(path, whole=True):
                verdict = (bool(record["correct"]), record.get("status"))
                by_problem[str(record["problem_id"])][int(record["sample"])] = verdict
            rows = {pid: [row[i] for i in sorted(row)] for pid, row in by_problem.items()}
            verdicts = {pid: [correct for correct, _ in row] for pid, row in rows.items()}
            statuses = {pid: [status for _, status in row] for pid, row in rows.items()}
            complete = all(status is not None for row in statuses.values() for status in row)
            self._cache[key] = verdicts, statuses if complete else None
        return self._cache[key]

    def problem_scores(self, step: int, benchmark: str, metric: str) -> dict[str, float]:
        """{problem id: the problem's `metric`, a fraction}, whose mean over problems is the evaluation's value:
        Mean@K or the unbiased Pass@K by the definitions of evaluation.metrics applied to that problem's row alone;
        the answered or truncated share of its first K samples (`evaluation.outcomes`). The accuracy given an
        answer is Σ correct / Σ answered over problems, a ratio no problem has alone: a problem's entry is its
        Mean@K over the evaluation's answered rate, its share of the ratio (`Metric.is_ratio`: only its mean over
        problems means anything). MissingSamples when no sample of the evaluation has an answer."""
        key = ("scores", step, benchmark, metric)
        if key not in self._cache:
            parsed = Metric.parse(metric)
            k = parsed.k
            rows = self.verdicts(step, benchmark)
            if any(len(row) < k for row in rows.values()):
                raise MissingSamples(f"{self.path}: step {step}, {benchmark}: fewer than {k} samples for {metric}")
            if parsed.is_ratio:
                answered_rate = str(Metric("answered", k))
                answered = outcome_parts(list(self.statuses(step, benchmark).values()), [k])[answered_rate]
                if not answered:
                    raise UndefinedScore(f"{self.path}: step {step}, {benchmark}: no answered sample for {metric}")
                correct = self.problem_scores(step, benchmark, str(Metric("mean", k)))
                self._cache[key] = {pid: value / answered for pid, value in correct.items()}
            elif parsed.is_part:
                statuses = self.statuses(step, benchmark)
                self._cache[key] = {pid: outcome_parts([row], [k])[metric] for pid, row in statuses.items()}
            else:
                self._cache[key] = {pid: summarize([row], ks=[k])[metric] for pid, row in rows.items()}
        return self._cache[key]

    @cached_property
    def metrics(self) -> list[dict[str, Any]]:
        """The lines of metrics.jsonl, each step once and in order: a step logged twice or out of order raises
        RunFileError naming the file (`records.metrics_lines`), since every table would count it twice."""
        return records.metrics_lines(layout.metrics_path(self.path), whole=True)

    @property
    def eval_steps(self) -> list[int]:
        return sorted({step for step, _ in self.summary})

    def eval_table(self, metric: str) -> dict[int, dict[str, float]]:
        """{step: {benchmark: value, "average": mean over the configured benchmarks}} in percent. A part of Mean@K
        (`Metric.is_part`) that a summary line lacks is computed from the evaluation's per-sample file.

        `average` is only defined at steps where every configured benchmark was evaluated (as in the paper).
        """
        table: dict[int, dict[str, float]] = {}
        part = Metric.is_name(metric) and Metric.parse(metric).is_part
        for (step, bench), row in self.summary.items():
            value = row.get(metric)
            if value is None and part:  # summaries written before the parts were: from the per-sample file
                value = self.sample_value(step, bench, metric)
            if isinstance(value, (int, float)) and not math.isnan(value):
                table.setdefault(step, {})[bench] = 100.0 * float(value)
        return self._with_average(table)

    def sample_value(self, step: int, benchmark: str, metric: str) -> float:
        """One evaluation's `metric` (a fraction) from its per-sample file: the mean of `problem_scores`, which is
        the ratio itself for the accuracy given an answer; nan when no sample has an answer to grade."""
        try:
            scores = self.problem_scores(step, benchmark, metric)
        except UndefinedScore:
            return math.nan
        return sum(scores.values()) / len(scores)

    def _with_average(self, table: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
        for values in table.values():
            if self.benchmarks and all(b in values for b in self.benchmarks):
                values[AVERAGE] = sum(values[b] for b in self.benchmarks) / len(self.benchmarks)
        return dict(sorted(table.items()))

    def _evaluated(self) -> dict[int, dict[str, float]]:
        """{step: {benchmark: 0.0, and AVERAGE once every configured benchmark is there}}: what was evaluated
        when, whatever metrics the summary lines hold (the per-sample files give the others)."""
        table: dict[int, dict[str, float]] = {}
        for step, bench in self.summary:
            table.setdefault(step, {})[bench] = 0.0
        return self._with_average(table)

    def final_eval_step(self, key: str) -> int | None:
        """The step of the final evaluation of `key`, a benchmark or AVERAGE (every configured benchmark)."""
        return final_step(self._evaluated(), key)

    def later_eval_steps(self, key: str) -> list[int]:
        """The steps after 0 that evaluated `key` (a benchmark, or AVERAGE): the points of the run's AUC."""
        return [step for step, values in self._evaluated().items() if step > 0 and key in values]


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(map(str, steps[:4])) + (f", …, {steps[-1]}" if len(steps) > 4 else "")
    return f"{shown} ({len(steps)} step{'s' * (len(steps) > 1)})"


def load_run(path: Path, grader: str | None = None) -> Run:
    """The run at `path`; an unreadable config.yaml or summary record becomes a problem of the run. A line of
    eval/summary.jsonl that is not JSON raises RunFileError, which names the file and the line."""
    try:
        config = rundir.load_config(layout.config_path(path), resolve=False)
    except (OSError, rundir.RunFileError) as err:  # a half-written config must not stop the other tables
        run = Run(path=path, config={}, problems=[f"{layout.CONFIG_FILE} unreadable ({err})"], grader=grader)
        run.__dict__["summary"] = {}
        return run
    run = Run(path=path, config=config, grader=grader)
    try:
        run.launch = rundir.read_json(layout.env_path(path)) if layout.env_path(path).is_file() else {}
    except (OSError, rundir.RunFileError) as err:  # the name then shows no launch setting: said, not hidden
        run.problems.append(f"{layout.ENV_FILE} unreadable ({err}): the method is named without its launch settings")
    source = layout.summary_path("") if grader is None else regrade.summary_path("", grader)
    try:
        summary = run.summary
    except rundir.RunFileError:  # a damaged line: named, and the results command stops (results.main)
        raise
    except (ValueError, KeyError, TypeError) as err:  # a line that is not a summary record
        run.__dict__["summary"] = {}
        run.problems.append(f"{source} unreadable ({err})")
        return run
    run.problems += failed_evaluations(path, config if isinstance(config, dict) else {}, summary)
    if not summary:
        hint = "" if grader is None else " (python -m atr_grpo.results regrade writes it)"
        run.problems.append(f"no evaluation ({source} missing or empty{hint})")
        return run
    for step in run.eval_steps:
        missing = [b for b in run.benchmarks if (step, b) not in summary]
        if missing:
            run.problems.append(f"step {step}: no {', '.join(missing)}")
    expected = run.expected_eval_steps
    if expected is not None:
        absent = [s for s in expected if s not in run.eval_steps]
        if absent:
            run.problems.append(f"no evaluation at step {_steps_text(absent)} of trainer.max_steps = {run.max_steps}")
    return run


def failed_evaluations(path: Path, config: dict[str, Any], summary: dict[tuple[int, str], Any]) -> list[str]:
    """Steps whose latest evaluation attempt failed (eval/failures.jsonl) and that no later attempt completed."""
    benchmarks = list((config.get("eval") or {}).get("benchmarks") or {name for _, name in summary})
    last_error: dict[int, str] = {}
    for record in read_failures(path):
        last_error[int(record["step"])] = str(record["error"])
    return [
        f"evaluation at step {step} failed: {error} (traceback in {layout.failures_path('')})"
        for step, error in sorted(last_error.items())
        if not benchmarks or any((step, name) not in summary for name in benchmarks)
    ]


def find_runs(root: str | Path, experiment: str | None = None, grader: str | None = None) -> list[Run]:
    """Every run directory under `root` (found by its config.yaml), its method named (`name_methods`), optionally
    of one experiment; with `grader`, each run's verdicts of that regrade."""
    runs = [load_run(p, grader) for p in rundir.find_run_dirs(root)]
    name_methods(runs)
    return [r for r in runs if experiment is None or r.experiment == experiment]


def name_methods(runs: list[Run]) -> None:
    """Set each run's `label`: its config's label (the rule and its non-default parameters), then ` · key=value`
    for each setting its launch command line changed (`rundir.launch_settings`). A name depends on the run alone, so
    it stays when runs with other settings join the study. Runs of one study and model (training runs and
    standalone evaluations apart) that still share a name but not their settings are told apart (`_tell_apart`)."""
    groups: dict[tuple[str, str, bool, str], list[Run]] = defaultdict(list)
    for run in runs:
        if run.config:
            shown = rundir.launch_settings(run.config, [str(a) for a in run.launch.get("argv") or []])
            run.label = rundir.METHOD_SEPARATOR.join([run.base_method, *shown])
            groups[(run.study, run.model, run.is_training, run.label)].append(run)
    for group in groups.values():
        _tell_apart(group)


def _tell_apart(runs: list[Run]) -> None:
    """Runs that share a name but differ in a setting (launched before env.json kept the command line, or from an
    experiment file edited between launches): the method launched first keeps the name, and each later one adds
    ` · key=value` for the settings in which it differs from that first one."""
    varying = varying_keys(runs)
    methods: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        methods[_identity(run, varying)].append(run)
    first, *later = sorted(methods.values(), key=lambda same: min(map(_launch_order, same)))
    for method in later:
        keys = varying_keys(first + method)
        for run in method:
            shown = [rundir.setting_text(k, run.settings.get(k, UNSET)) for k in keys]
            run.label = rundir.METHOD_SEPARATOR.join([run.method, *shown])


def _launch_order(run: Run) -> tuple[str, str]:
    """When the run was launched (env.json's start time; none sorts first, as the older file), then its path."""
    return str(run.launch.get("start_time") or ""), str(run.path)


def varying_keys(runs: list[Run]) -> list[str]:
    """The settings whose value (or presence) is not the same in every run, sorted; those that follow the seed
    (equal to it in every run, as `sft.seed: ${seed}` or `eval.seed: ${seed}`) belong to the seed, not the method."""
    keys = sorted({k for run in runs for k in run.settings})
    return [
        k
        for k in keys
        if len({json.dumps(r.settings.get(k, UNSET), default=str) for r in runs}) > 1
        and not all(_is_seed(r.settings.get(k), r.seed) for r in runs)
    ]


def _identity(run: Run, keys: list[str]) -> str:
    """The run's values of `keys`: two runs of one method agree on every setting that varies, not on the seed."""
    return json.dumps({k: run.settings.get(k, UNSET) for k in keys}, sort_keys=True, default=str)


def _is_seed(value: Any, seed: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == seed


UNSET = "–"  # a setting a run's config.yaml does not have (written before the key existed)


class RepeatedRuns(ValueError):
    """Two runs are the same point: same study, model, settings and seed (the message names both)."""


def refuse_repeats(runs: list[Run]) -> list[Run]:
    """`runs` in path order; RepeatedRuns naming both runs of every pair that repeats one point.

    Re-launching a finished config into a fresh run_dir repeats a seed. Averaging repeats as if they were seeds
    would shrink the spread, and keeping one would be a silent choice, so a repeat stops the tables and
    `compare`. Runs whose config.yaml is unreadable are kept (their problem is reported with them).
    """
    groups: dict[tuple[str, str, str, int], list[Run]] = defaultdict(list)
    for run in runs:
        if run.config:
            groups[run.key].append(run)
    clashes = [sorted(group, key=lambda r: str(r.path)) for group in groups.values() if len(group) > 1]
    if clashes:
        lines = [
            f"{' and '.join(str(r.path) for r in group)} repeat one point (study {group[0].study}, model "
            f"{group[0].model}, method {group[0].method}, seed {group[0].seed})"
            for group in sorted(clashes, key=lambda g: str(g[0].path))
        ]
        raise RepeatedRuns(
            "; ".join(lines) + ". Their configs differ at most in where or how fast they ran "
            "(rundir.NOT_METHOD_KEYS); move all but one out of --runs, or give one another seed or study"
        )
    return sorted(runs, key=lambda r: str(r.path))


class RunSet(list):
    """Runs checked once for repeats (`RunSet.checked`), in the order they were given: an analysis handed one takes
    its runs through `repeat_free` without checking them again. Every run in it was checked, so keep it to the runs
    that were: a subset of a RunSet is repeat-free, a union is not."""

    @classmethod
    def checked(cls, runs: list[Run]) -> RunSet:
        """`runs`, checked by `refuse_repeats` (RepeatedRuns as it raises it), in their order."""
        refuse_repeats(runs)
        return cls(runs)


def repeat_free(runs: list[Run], keep: Callable[[Run], bool] | None = None) -> list[Run]:
    """The runs `keep` accepts (all by default) in path order, as `refuse_repeats` returns them: a RunSet was
    checked and is only filtered; any other list is checked here (RepeatedRuns)."""
    chosen = [run for run in runs if keep is None or keep(run)]
    if isinstance(runs, RunSet):
        return sorted(chosen, key=lambda r: str(r.path))
    return refuse_repeats(chosen)


def problems(runs: list[Run]) -> list[str]:
    """Every run's own problems (its own schedule's missing steps among them), plus training runs whose last
    evaluation is before that of other runs of their method and study. A variant with other settings, such as a
    longer trainer.max_steps, is no measure: it is another method."""
    lines = [f"{run.path}: {problem}" for run in runs for problem in run.problems]
    last: dict[tuple[str, str, str], int] = {}
    for run in runs:
        if run.max_steps is not None and run.eval_steps:
            group = (run.study, run.model, run.method)
            last[group] = max(last.get(group, 0), run.eval_steps[-1])
    for run in runs:
        if run.max_steps is None or not run.eval_steps:
            continue
        reached = last[(run.study, run.model, run.method)]
        if run.eval_steps[-1] < reached and not any(p.startswith("no evaluation at step") for p in run.problems):
            lines.append(
                f"{run.path}: last evaluation at step {run.eval_steps[-1]}, other runs of {run.method} in study "
                f"{run.study} reach step {reached}"
            )
    return lines


def _counted_steps(table: dict[int, dict[str, float]], key: str) -> list[int]:
    """The steps that have `key`, without step 0 (the start) when later steps exist: the paper's "final
    (best)" is about checkpoints reached by training."""
    steps = [s for s in table if key in table[s]]
    return [s for s in steps if s > 0] if len(steps) > 1 else steps


def final_step(table: dict[int, dict[str, float]], key: str) -> int | None:
    """The step of the final value of `key` (see `final_and_best`)."""
    steps = _counted_steps(table, key)
    return steps[-1] if steps else None


def final_and_best(table: dict[int, dict[str, float]], key: str) -> tuple[float, float] | None:
    """(value at the last step that has `key`, max over steps), excluding step 0 when later steps exist."""
    steps = _counted_steps(table, key)
    if not steps:
        return None
    return table[steps[-1]][key], max(table[s][key] for s in steps)


def mean_std(values: list[float], ddof: int = 1) -> tuple[float, float]:
    """Mean and standard deviation over seeds; std is nan for a single value (no spread to report).

    ddof = 1, the sample SD, is the results' one convention. `table3 --ddof 0` asks for the population SD that the
    paper's Table 3 uses: its Pass@8 stds on 30-problem AIME sets (1.57, 2.72, 3.14, 4.16, 4.71, 5.67) are exactly
    the population stds of three multiples of 1/30.
    """
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - ddof))


def metric_number(value: Any) -> float | None:
    """A metrics.jsonl value as a float; None for a missing, non-numeric, boolean or NaN value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def two_decimals(value: float) -> float:
    """A table's value (a percentage) rounded to 2 decimals; nan stays nan."""
    return round(value, 2) if not math.isnan(value) else math.nan


def mean_or_nan(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def run_columns(run: Run) -> dict[str, Any]:
    """The columns that name a run in the per-run tables."""
    return {"experiment": run.scope, "model": run.model, "method": run.method, "seed": run.seed}
