"""One evaluation of one model at one step: prompts → samples → grades → files and metrics.

`run_evaluation` renders every problem with the training prompt (`atr_grpo.data.prompts.render_prompt`),
draws n samples per problem from a backend, grades them in worker processes, writes the per-sample
file and the summary line of each benchmark (see `outputs` for the layout and the overwrite policy) and
returns a flat dict for the logger: `eval/<benchmark>/mean@K`, `eval/<benchmark>/pass@K`, what Mean@K is made of
(`eval/<benchmark>/answered@K`, `.../acc_given_answer@K`, `.../truncated@K`: `outcomes.outcome_parts`), each one's
standard error (`eval/<benchmark>/mean@K_stderr`, ...), `eval/average/...` for K in {1, k}, and
`eval/<benchmark>/status/<status>` counts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.data.prompts import DEFAULT_SYSTEM_PROMPT, prompt_fingerprint, render_prompt
from atr_grpo.evaluation.backends import Generator, Sample
from atr_grpo.evaluation.benchmarks import Benchmark, Problem
from atr_grpo.evaluation.grader import (
    DEFAULT_TIMEOUT,
    FINISH_REASONS,
    STATUSES,
    GradeResult,
    grade_samples,
    status_counts,
)
from atr_grpo.evaluation.metrics import STDERR_SUFFIX, average
from atr_grpo.evaluation.outcomes import PARTS, summary_scores
from atr_grpo.evaluation.outputs import move_aside, read_summary, sample_file, write_samples
from atr_grpo.evaluation.sampling import SamplingConfig
from atr_grpo.rundir.records import REPLACES

log = logging.getLogger(__name__)
# the training step an evaluation is of, logged beside its keys: the x axis of every eval/* key in W&B
EVAL_STEP = "eval/step"


def _grader_version() -> str:
    try:
        return f"math-verify=={importlib_metadata.version('math-verify')}"
    except importlib_metadata.PackageNotFoundError:
        return "math-verify"


def evaluate_benchmark(
    generator: Generator,
    tokenizer: Any,
    benchmark: Benchmark,
    sampling: SamplingConfig,
    *,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    enable_thinking: bool = False,
    grader_workers: int | None = None,
    grader_timeout: float = DEFAULT_TIMEOUT,
    credit_inside_think: bool = False,
    show_progress: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sample and grade one benchmark; returns (per-sample records, summary fields without step/benchmark).

    credit_inside_think: grade a box inside `<think>...</think>` too (eval.credit_inside_think; see the grader).
    """
    from tqdm.auto import tqdm

    problems = benchmark.problems
    prompts = [render_prompt(tokenizer, p.problem, system_prompt, enable_thinking) for p in problems]
    started = time.time()
    samples = generator.generate(prompts, sampling)
    generated = time.time()
    jobs = [(s.text, p.gold, s.finish_reason) for p, row in zip(problems, samples) for s in row]
    with tqdm(total=len(jobs), desc=f"grade {benchmark.name}", disable=not show_progress, leave=False) as bar:
        results = grade_samples(
            jobs, workers=grader_workers, timeout=grader_timeout, progress=bar, credit_inside_think=credit_inside_think
        )
    records, statuses = sample_records(problems, samples, results)
    summary = {
        "num_problems": len(problems),
        "n": sampling.n,
        **summary_scores(statuses),
        "status_counts": status_counts(results),
        "finish_counts": finish_counts(samples),
        "mean_num_tokens": sum(r["num_tokens"] for r in records) / len(records),
        **_provenance(generator, tokenizer, benchmark, sampling, system_prompt, enable_thinking, credit_inside_think),
        "generate_s": round(generated - started, 2),
        "grade_s": round(time.time() - generated, 2),
        "time_s": round(time.time() - started, 2),
    }
    return records, summary


def finish_counts(samples: Sequence[Sequence[Sample]]) -> dict[str, int]:
    """How many samples the engine ended at a stop token (`stop`) and at max_tokens (`length`): the engine's
    truncation, beside the grader's `truncated` status (the same samples: a truncated sample is never graded)."""
    reasons = [sample.finish_reason for row in samples for sample in row]
    return {reason: reasons.count(reason) for reason in FINISH_REASONS}


def sample_records(
    problems: Sequence[Problem], samples: Sequence[Sequence[Sample]], results: Sequence[GradeResult]
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """(the per-sample file's records, the [problem][sample] matrix of grader statuses), from each problem's samples
    and their grades in the same order."""
    grades = iter(results)
    records, matrix = [], []
    for problem, row in zip(problems, samples):
        statuses = []
        for index, sample in enumerate(row):
            result = next(grades)
            statuses.append(result.status)
            records.append(
                {
                    "problem_id": problem.id,
                    "problem": problem.problem,
                    "sample": index,
                    "completion": sample.text,
                    "extracted": result.extracted,
                    "gold": problem.gold,
                    "correct": result.correct,
                    "status": result.status,
                    "finish_reason": sample.finish_reason,
                    "num_tokens": sample.num_tokens,
                }
            )
        matrix.append(statuses)
    return records, matrix


def _provenance(
    generator: Generator,
    tokenizer: Any,
    benchmark: Benchmark,
    sampling: SamplingConfig,
    system_prompt: str,
    enable_thinking: bool,
    credit_inside_think: bool,
) -> dict[str, Any]:
    """What the summary line records of how the samples were made and graded: the benchmark's content, the prompt,
    the sampling settings, the backend and the grader."""
    return {
        "content_hash": benchmark.content_hash,
        "source": benchmark.source,
        "prompt_hash": prompt_fingerprint(tokenizer, system_prompt, enable_thinking),
        "enable_thinking": enable_thinking,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_tokens": sampling.max_tokens,
        "seed": sampling.seed,  # a training run's summary line holds the run's seed here (its metadata)
        "drawn_seed": sampling.seed,  # the seed the samples were drawn with (eval.seed, or its step's step_seed)
        "backend": getattr(generator, "name", type(generator).__name__),
        "grader": _grader_version(),
        "credit_inside_think": credit_inside_think,
    }


def run_evaluation(
    generator: Generator,
    tokenizer: Any,
    benchmarks: Sequence[Benchmark],
    sampling: SamplingConfig,
    run_dir: str | Path,
    step: int,
    *,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    enable_thinking: bool = False,
    k: int = 8,
    grader_workers: int | None = None,
    grader_timeout: float = DEFAULT_TIMEOUT,
    credit_inside_think: bool = False,
    force: bool = False,
    metadata: dict[str, Any] | None = None,
    show_progress: bool = True,
    log_skips: bool = True,
) -> dict[str, float]:
    """Evaluate every benchmark at `step` into `run_dir/eval/`; returns the logger's flat metrics dict.

    A (step, benchmark) already in eval/summary.jsonl is not evaluated again (its recorded values are
    returned) unless `force`, with a log line each unless `log_skips` is off (the caller said so already).
    `metadata` (e.g. the model and adapter) is added to each summary line.
    """
    _check_request(benchmarks, sampling, k)
    done = read_summary(run_dir)
    rows: dict[str, dict[str, Any]] = {}
    for benchmark in benchmarks:
        key = (step, benchmark.name)
        if key in done and not force:
            if log_skips:
                log.info("step %d, %s: already in %s; skipped", step, benchmark.name, rundir.SUMMARY_FILE)
            rows[benchmark.name] = done[key]
            continue
        path = sample_file(run_dir, step, benchmark.name)
        # a forced re-evaluation: its summary line says it replaces the recorded one (and where its samples went)
        replaces = {REPLACES: path.name} if key in done else {}
        if path.exists():
            moved = move_aside(path, "replaced" if key in done else "interrupted")
            log.warning("step %d, %s: moved the earlier per-sample file to %s", step, benchmark.name, moved)
            replaces = {REPLACES: moved.name} if key in done else {}
        records, summary = evaluate_benchmark(
            generator,
            tokenizer,
            benchmark,
            sampling,
            system_prompt=system_prompt,
            enable_thinking=enable_thinking,
            grader_workers=grader_workers,
            grader_timeout=grader_timeout,
            credit_inside_think=credit_inside_think,
            show_progress=show_progress,
        )
        row = {"step": step, "benchmark": benchmark.name, **summary, **(metadata or {}), **replaces}
        write_samples(path, records)
        rundir.append_jsonl(rundir.summary_path(run_dir), row)  # the commit record, written last
        _log_result(step, benchmark.name, row, k)
        rows[benchmark.name] = row
    return flat_metrics(rows, k)


def _check_request(benchmarks: Sequence[Benchmark], sampling: SamplingConfig, k: int) -> None:
    if not 1 <= k <= sampling.n:
        raise ValueError(f"k={k} must be in 1..n={sampling.n}: Pass@K needs at least K samples per problem")
    names = [b.name for b in benchmarks]
    if len(set(names)) != len(names):
        raise ValueError(f"benchmark names repeat: {names}")


def _log_result(step: int, name: str, row: dict[str, Any], k: int) -> None:
    """One line per evaluated benchmark: its Mean@K, Pass@K and the parts of Mean@K ± their standard errors, sample
    statuses and time."""
    counts = ", ".join(f"{status} {n}" for status, n in row["status_counts"].items())
    shown = [f"{m}@{k}" for m in ("mean", "pass", *PARTS) if row.get(f"{m}@{k}") is not None]
    values = ", ".join(f"{key} {with_stderr(row[key], row.get(key + STDERR_SUFFIX))}" for key in shown)
    log.info("step %d, %s: %s; samples: %s (%.0f s)", step, name, values, counts, row["time_s"])


def with_stderr(value: float, stderr: float | None, scale: float = 1.0, digits: int = 4) -> str:
    """`0.4375 ± 0.0625`; the value alone when there is no standard error (one problem, or a line written before
    summaries carried one)."""
    text = f"{scale * value:.{digits}f}"
    return text if stderr is None else f"{text} ± {scale * stderr:.{digits}f}"


def flat_metrics(rows: dict[str, dict[str, Any]], k: int) -> dict[str, float]:
    """`eval/<benchmark>/{mean,pass,answered,acc_given_answer,truncated}@{1,k}`, their `_stderr`,
    `eval/<benchmark>/status/<status>`, `eval/<benchmark>/finish/{stop,length}` and `eval/average/...`. A value the
    summary line lacks (a line written before it was recorded) or holds as None (a standard error of one problem,
    the accuracy given no answer) is left out."""
    ks = sorted({1, k})
    names = [f"{m}@{K}{suffix}" for K in ks for m in ("mean", "pass", *PARTS) for suffix in ("", STDERR_SUFFIX)]
    out: dict[str, float] = {}
    per_benchmark = []
    for name, row in rows.items():
        values = {key: row[key] for key in names if key in row}
        per_benchmark.append(values)
        out.update({f"eval/{name}/{key}": value for key, value in values.items() if value is not None})
        counts = row.get("status_counts", {})
        out.update({f"eval/{name}/status/{status}": counts.get(status, 0) for status in STATUSES})
        finished = row.get("finish_counts")  # a line written before summaries carried them has none
        if finished is not None:
            out.update({f"eval/{name}/finish/{reason}": finished.get(reason, 0) for reason in FINISH_REASONS})
    out.update({f"eval/average/{key}": value for key, value in average(per_benchmark).items() if value is not None})
    return out
