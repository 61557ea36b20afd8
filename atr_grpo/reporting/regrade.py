"""Re-grade every saved sample with the current grader, beside the original verdicts, never over them.

    <run_dir>/eval/regrade/<tag>/
      grader.json                          what grades: math-verify and its parsers' versions, the grader code's hash
      summary.jsonl                        one line per (step, benchmark), with the scores of eval/summary.jsonl
      step_<step:06d>/<benchmark>.jsonl    the new verdict of every sample (problem_id, sample, extracted, ...)
      changes.jsonl                        every sample whose status changed: gold, before and after

The tag names the grader exactly (`math-verify-<version>__<hash>`, the hash over the versions of math-verify,
latex2sympy2_extended and sympy and the bytes of `evaluation/grader.py` and `evaluation/gold.py`), so unchanged code
gives the same tag
and a second regrade only grades what is new: evaluations added since, or replaced ones (each summary line
records the sha256 of the per-sample file it graded). As in eval/, the verdict file is written completely
before its summary line, which is the commit record; a verdict file without one is moved aside, not reused.
Each run is regraded with the `eval.credit_inside_think` its config.yaml records (false when absent, as for
runs from before the setting existed), and each summary line records it.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from atr_grpo import run_environment, rundir
from atr_grpo.evaluation import gold, grader
from atr_grpo.evaluation.outcomes import summary_scores
from atr_grpo.evaluation.outputs import find_sample_file, move_aside, read_summary, read_summary_file, write_samples
from atr_grpo.rundir import layout

GRADER_PACKAGES = ("math-verify", "latex2sympy2_extended", "sympy")
GRADER_MODULES = (grader, gold)  # the code that decides a verdict: grading, and the reading of gold answers


# ------------------------------------------------------------------------------------------------ layout
def regrade_dir(run_dir: str | Path, tag: str) -> Path:
    return layout.regrade_dir(run_dir, tag)


def summary_path(run_dir: str | Path, tag: str) -> Path:
    return regrade_dir(run_dir, tag) / layout.SUMMARY_FILE


def verdict_file(run_dir: str | Path, tag: str, step: int, benchmark: str) -> Path:
    return layout.sample_file_in(regrade_dir(run_dir, tag), step, benchmark)


def tags(run_dir: str | Path) -> list[str]:
    """The regrades a run has (folders with a summary)."""
    root = layout.regrades_dir(run_dir)
    return sorted(p.parent.name for p in root.glob(f"*/{layout.SUMMARY_FILE}")) if root.is_dir() else []


# ------------------------------------------------------------------------------------------------ identity
def grader_identity() -> dict[str, Any]:
    """The versions and code that decide a verdict, and the tag that names them."""
    versions = {}
    for name in GRADER_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    code = hashlib.sha256()
    for module in GRADER_MODULES:
        code.update(hashlib.sha256(Path(module.__file__).read_bytes()).digest())
    digest = hashlib.sha256(repr((sorted(versions.items()), code.hexdigest())).encode()).hexdigest()[:10]
    return {
        "tag": f"math-verify-{versions['math-verify']}__{digest}",
        "packages": versions,
        "grader_code_sha256": code.hexdigest(),
    }


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------ regrade
@dataclass
class BenchmarkChanges:
    """What a regrade found for one benchmark of one run, over its evaluation steps."""

    run: Path
    benchmark: str
    steps: list[int] = field(default_factory=list)
    samples: int = 0
    changed: int = 0  # verdicts (correct or not) that differ from the original
    status_changed: int = 0  # statuses that differ (wrong → no_answer changes no score but is counted here)
    examples: list[dict[str, Any]] = field(default_factory=list)
    reused: bool = False  # every step already regraded with this tag: counts from its summary lines


def _changes(before: dict[str, Any], after: grader.GradeResult) -> tuple[bool, bool]:
    """(verdict changed, status changed); files from before statuses were recorded compare verdicts only."""
    verdict = bool(before.get("correct")) != after.correct
    return verdict, verdict or before.get("status", after.status) != after.status


def _record(before: dict[str, Any], after: grader.GradeResult) -> dict[str, Any]:
    return {
        "problem_id": before["problem_id"],
        "sample": before["sample"],
        "extracted": after.extracted,
        "correct": after.correct,
        "status": after.status,
    }


def _regraded(run_dir: Path, tag: str) -> dict[tuple[int, str], dict[str, Any]]:
    """The summary line of every (step, benchmark) this grader has regraded (the last one of each)."""
    return read_summary_file(summary_path(run_dir, tag), whole=True)


def _pending(run_dir: Path, tag: str, warn: Callable[[str], None]) -> tuple[list, dict]:
    """(evaluations to grade as (step, benchmark, source path, sha256), those already regraded)."""
    done = _regraded(run_dir, tag)
    todo, reused = [], {}
    for step, bench in sorted(read_summary(run_dir, whole=True)):
        source = find_sample_file(run_dir, step, bench)
        if source is None:
            warn(f"{run_dir}: step {step}, {bench} has a summary line but no per-sample file: not regraded")
            continue
        digest = _file_sha256(source)
        if (step, bench) in done and done[(step, bench)].get("source_sha256") == digest:
            reused[(step, bench)] = done[(step, bench)]
        else:
            todo.append((step, bench, source, digest))
    return todo, reused


def regrade_run(
    run_dir: str | Path,
    identity: dict[str, Any],
    workers: int | None = None,
    timeout: float = grader.DEFAULT_TIMEOUT,
    examples: int = 3,
    show_progress: bool = True,
    warn: Callable[[str], None] = print,
    credit_inside_think: bool = False,
) -> list[BenchmarkChanges]:
    """Regrade every evaluation of the run that this grader has not graded yet; returns what changed.

    credit_inside_think: the run's `eval.credit_inside_think` (a box inside `<think>...</think>` counts).
    """
    from tqdm.auto import tqdm

    run_dir, tag = Path(run_dir), identity["tag"]
    out_dir = regrade_dir(run_dir, tag)
    with rundir.file_lock(out_dir / ".lock"):
        if not (out_dir / layout.GRADER_FILE).exists():
            rundir.write_json(out_dir / layout.GRADER_FILE, identity, overwrite=False)
        todo, reused = _pending(run_dir, tag, warn)
        originals = {(s, b): rundir.read_jsonl(path, whole=True) for s, b, path, _ in todo}
        jobs = [
            (str(r["completion"]), str(r["gold"]), r.get("finish_reason")) for rows in originals.values() for r in rows
        ]
        with tqdm(total=len(jobs), desc=f"regrade {run_dir.name}", disable=not show_progress, leave=False) as bar:
            results = iter(
                grader.grade_samples(
                    jobs, workers=workers, timeout=timeout, progress=bar, credit_inside_think=credit_inside_think
                )
            )
        report: dict[str, BenchmarkChanges] = {}
        for step, bench, source, digest in todo:
            changes = report.setdefault(bench, BenchmarkChanges(run_dir, bench))
            before_rows = originals[(step, bench)]
            after = [next(results) for _ in before_rows]
            _write_evaluation(
                run_dir, tag, step, bench, source, digest, before_rows, after, changes, examples, credit_inside_think
            )
        for (step, bench), row in sorted(reused.items()):
            changes = report.setdefault(bench, BenchmarkChanges(run_dir, bench, reused=True))
            changes.steps.append(step)
            changes.samples += int(row["samples"])
            changes.changed += int(row["changed"])
            changes.status_changed += int(row["status_changed"])
    for changes in report.values():
        changes.steps.sort()
    return [report[b] for b in sorted(report)]


@dataclass
class Regraded:
    """One evaluation's samples regraded: what the new verdict file holds and what changed."""

    records: list[dict[str, Any]]  # the verdict file's lines
    changed_lines: list[dict[str, Any]]  # one per sample whose status (or verdict) changed
    statuses: list[list[str]]  # [problem][sample] the new grader status
    changed: int  # verdicts changed
    status_changed: int


def _regrade_samples(
    step: int, bench: str, before_rows: list[dict[str, Any]], after: list[grader.GradeResult]
) -> Regraded:
    """Compare each sample's recorded grade with its new one."""
    records, changed_lines, by_problem = [], [], defaultdict(dict)
    n_changed = n_status = 0
    for before, result in zip(before_rows, after):
        records.append(_record(before, result))
        by_problem[str(before["problem_id"])][int(before["sample"])] = result.status
        verdict, status = _changes(before, result)
        n_changed, n_status = n_changed + verdict, n_status + status
        if status:
            changed_lines.append(
                {
                    "step": step,
                    "benchmark": bench,
                    "problem_id": before["problem_id"],
                    "sample": before["sample"],
                    "gold": before.get("gold"),
                    "verdict_changed": verdict,
                    "before": {k: before.get(k) for k in ("status", "correct", "extracted")},
                    "after": {k: _record(before, result)[k] for k in ("status", "correct", "extracted")},
                }
            )
    statuses = [[row[i] for i in sorted(row)] for row in by_problem.values()]
    return Regraded(records, changed_lines, statuses, n_changed, n_status)


def _write_evaluation(
    run_dir: Path,
    tag: str,
    step: int,
    bench: str,
    source: Path,
    digest: str,
    before_rows: list[dict[str, Any]],
    after: list[grader.GradeResult],
    changes: BenchmarkChanges,
    examples: int,
    credit_inside_think: bool,
) -> None:
    """The verdict file, the changes and, last, the summary line of one regraded evaluation."""
    regraded = _regrade_samples(step, bench, before_rows, after)
    verdicts_changed = [line for line in regraded.changed_lines if line["verdict_changed"]]
    changes.examples += verdicts_changed[: max(examples - len(changes.examples), 0)]
    path = verdict_file(run_dir, tag, step, bench)
    original = read_summary(run_dir, whole=True).get((step, bench), {})
    if path.exists():  # graded from a per-sample file replaced since, or left by an interrupted regrade
        move_aside(path, "replaced" if (step, bench) in _regraded(run_dir, tag) else "interrupted")
    write_samples(path, regraded.records)
    if regraded.changed_lines:
        rundir.append_jsonl(regrade_dir(run_dir, tag) / layout.CHANGES_FILE, regraded.changed_lines)
    statuses = regraded.statuses
    line = {
        "step": step,
        "benchmark": bench,
        "num_problems": len(statuses),
        "n": len(statuses[0]) if statuses else 0,
        **(summary_scores(statuses) if statuses else {}),  # Mean@K, Pass@K, the parts of Mean@K, their SEs
        "status_counts": grader.status_counts(after),
        "samples": len(after),
        "changed": regraded.changed,
        "status_changed": regraded.status_changed,
        "grader": tag,
        "grader_before": original.get("grader"),
        "credit_inside_think": credit_inside_think,
        "source": str(source.relative_to(run_dir)),
        "source_sha256": digest,
        "git_commit": run_environment.git_commit(),
        "regraded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rundir.append_jsonl(summary_path(run_dir, tag), line)
    changes.steps.append(step)
    changes.samples += len(after)
    changes.changed += regraded.changed
    changes.status_changed += regraded.status_changed


def format_changes(found: Sequence[BenchmarkChanges]) -> list[str]:
    """One line per run and benchmark, then its example changes."""
    lines = []
    for c in found:
        steps = ", ".join(map(str, c.steps))
        again = " (already regraded with this grader)" if c.reused else ""
        lines.append(
            f"{c.run}: {c.benchmark}: {c.changed} of {c.samples} verdicts changed, {c.status_changed} "
            f"statuses (steps {steps}){again}"
        )
        for e in c.examples:
            before, after = e["before"], e["after"]
            lines.append(
                f"    step {e['step']}, problem {e['problem_id']}, sample {e['sample']}: gold {e['gold']!r}, "
                f"extracted {after['extracted']!r}: {before['status']} → {after['status']}"
            )
    return lines
