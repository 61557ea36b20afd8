"""`python -m atr_grpo.reproduce PLAN --runs DIR --out DIR [--rerun] [--jobs N] [--methods a,b]`: run a CPU
experiment's plan, then rebuild its tables and figures and pack its per-sample files (`make reproduce-mini`,
`make reproduce-power`). When the experiment's analysis plan (plan.yaml beside --runs) names a final evaluation,
`python -m atr_grpo.final_eval` runs it between the training runs and the tables (`make reproduce-power3`).

Without --rerun the runs go to the experiment's own folder (--runs, e.g. results/mini/runs), where finished runs
are kept and not re-run: on a clone with committed runs this rebuilds the tables from them, and the last line
says so ("re-ran 0"). With --rerun the runs go to <out>/runs, a fresh folder, and the tables and figures to
<out>/tables and <out>/figures: a reproduction from scratch that leaves the committed runs alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from atr_grpo import final_eval, launch, results
from atr_grpo.reporting.plan import PlanError, default_path, load_plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.reproduce", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("plan", help="an experiment with a plan: key (conf/experiment/<PLAN>.yaml)")
    parser.add_argument("--runs", type=Path, required=True, help="the experiment's run folder (without --rerun)")
    parser.add_argument("--out", type=Path, required=True, help="where tables/ and figures/ go (and runs/, --rerun)")
    parser.add_argument("--rerun", action="store_true", help="run every run again, into <out>/runs")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (see python -m atr_grpo.launch)")
    parser.add_argument("--methods", default=None, help="figures: comma-separated methods to draw (default all)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides appended to every run")
    opts = parser.parse_args(argv)
    try:
        plan = launch.load_plan(opts.plan)
    except launch.PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    experiment = plan.name  # a plan is its experiment's
    runs = opts.out / "runs" if opts.rerun else opts.runs
    if opts.rerun and (opts.out.resolve() == opts.runs.resolve().parent or opts.out.resolve() == opts.runs.resolve()):
        parser.error(f"--out {opts.out} is where the committed runs live: --rerun needs a fresh folder")
    tally = launch.run_plan(plan, list(opts.overrides), False, opts.jobs, runs if opts.rerun else None)
    if tally.refused:
        return 2
    analysis = default_path(opts.runs)  # the committed plan, beside the experiment's own run folder
    try:
        final = load_plan(analysis).final_evaluation if analysis.is_file() else None
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if final is not None:
        status = final_eval.main(["--runs", str(runs), "--plan", str(analysis), "--jobs", str(opts.jobs)])
        if status:
            return status
    shared = ["--runs", str(runs), "--experiment", experiment]
    status = results.main(["all", *shared, "--out", str(opts.out / "tables")])
    figures = ["figures", *shared, "--out", str(opts.out / "figures")]
    status = status or results.main(figures + (["--methods", opts.methods] if opts.methods else []))
    status = status or results.main(["pack", "--runs", str(runs)])
    used = len(tally.finished) + len(tally.launched) - len(tally.failed)
    print(
        f"{opts.plan}: rebuilt tables from {used} runs in {runs} ({len(tally.finished)} finished before this "
        "command, not re-run); "
        f"re-ran {len(tally.launched)}{f', {len(tally.failed)} failed' if tally.failed else ''}"
    )
    return status or tally.exit_code


if __name__ == "__main__":
    sys.exit(main())
