"""`python -m atr_grpo.demo [key=value ...]` (what `make demo` runs): the whole protocol on a laptop CPU.

A tiny Qwen3 learns a synthetic arithmetic task: SFT format stage → GRPO with ATR clipping → Mean@8 /
Pass@8 on held-out problems before GRPO (step 0) and after it, with the two parts Mean@8 is made of: the answered
rate and the accuracy given an answer (`evaluation.outcomes`). The run directory is an ordinary one
(results/runs/demo/...); `results/demo/summary.json` and the printed table are rebuilt from its
eval/summary.jsonl. A repeated demo gets a new run directory, so no earlier run is touched.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.console import PART_COLUMNS, PARTS_NOTE, percent, text_table
from atr_grpo.rundir import records

SUMMARY_DIR = Path("results/demo")


def compose_demo(overrides: list[str]) -> Any:
    from atr_grpo.hydra_app import compose_train

    return compose_train(["experiment=demo", *overrides])


def free_run_dir(run_dir: str) -> str:
    """`run_dir` itself if unused, else run_dir-2, -3, ...: a repeated demo never touches an earlier one."""
    candidate, n = Path(run_dir), 1
    while (candidate / rundir.CONFIG_FILE).exists():
        n += 1
        candidate = Path(f"{run_dir}-{n}")
    return str(candidate)


def before_after(run_dir: Path, k: int) -> dict[str, Any]:
    """Step 0 and the last evaluated step of the demo benchmark, from the run's own files."""
    rows = [r for r in records.summary_lines(rundir.summary_path(run_dir)) if r["benchmark"] == "arithmetic"]
    if not rows:
        raise RuntimeError(f"{run_dir}: no evaluation of the arithmetic benchmark was written")
    first = min(rows, key=lambda r: r["step"])
    last = max(rows, key=lambda r: r["step"])
    if first["step"] != 0 or last["step"] == 0:
        raise RuntimeError(f"{run_dir}: the demo needs an evaluation at step 0 and after training")
    pick = lambda r: {key: r.get(key) for key in shown_keys(k)}
    return {"before": pick(first), "after": pick(last), "steps": last["step"]}


def write_summary(summary: dict[str, Any], out_dir: Path = SUMMARY_DIR) -> Path:
    """results/demo/summary.json; an earlier summary is kept beside it under its run's name."""
    path = out_dir / "summary.json"
    if path.exists():
        previous = rundir.read_json(path)
        keep = out_dir / f"summary-{Path(previous.get('run_dir', 'previous')).name}.json"
        if not keep.exists():
            path.rename(keep)
    rundir.write_json(path, summary)
    return path


def shown_keys(k: int) -> tuple[str, ...]:
    """The summary's values the demo shows: Mean@K, Pass@K and Mean@K's two parts."""
    return f"mean@{k}", f"pass@{k}", *(f"{key}@{k}" for _, key in PART_COLUMNS)


def format_table(summary: dict[str, Any], k: int) -> str:
    rows = [("", f"Mean@{k}", f"Pass@{k}", *(header for header, _ in PART_COLUMNS))]
    for label in ("before", "after"):
        values = summary[label]
        rows.append((f"{label} GRPO", *(percent(values.get(key)) for key in shown_keys(k))))
    lines = text_table(rows)
    lines.append(PARTS_NOTE.format(k=k))
    lines.append(f"{summary['steps']} GRPO steps, {summary['seconds']:.0f} s in all; run files: {summary['run_dir']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from atr_grpo.config_hydra import to_object
    from atr_grpo.console import configure_logging
    from atr_grpo.errors import ConfigError
    from atr_grpo.rundir import RunFileError
    from atr_grpo.training.pipeline import EXIT_EVALUATIONS_INCOMPLETE, RunDirError, run_pipeline

    configure_logging()
    overrides = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    cfg = compose_demo(overrides)
    cfg.run_dir = free_run_dir(OmegaConf.select(cfg, "run_dir"))
    try:
        train_cfg = to_object(cfg)
        outcome = run_pipeline(train_cfg, OmegaConf.to_yaml(cfg, resolve=True))
    except (ConfigError, RunDirError, RunFileError) as err:  # RunFileError: a folder in use or not writable
        print(err, file=sys.stderr)
        return 2
    if outcome is None:  # a process other than the first under a launcher: the first one reports
        return 0
    if not outcome.ok:
        print(outcome.summary(), file=sys.stderr)
        return EXIT_EVALUATIONS_INCOMPLETE
    run_dir = outcome.run_dir
    k = train_cfg.eval.k
    summary = {
        **before_after(run_dir, k),
        "seconds": round(time.time() - started, 1),
        "run_dir": str(run_dir),
    }
    path = write_summary(summary)
    print("\n" + format_table(summary, k))
    print(f"summary: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
