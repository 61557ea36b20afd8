"""`python -m atr_grpo.final_eval --runs DIR [--plan FILE] [--jobs N]`: the final evaluation an analysis plan names
(`final_evaluation` in `plan.yaml`), run on each finished training run of its experiment.

Each run's `final_adapter` is evaluated once more, at the plan's temperature and top-p, into
`<run>/<folder>/eval/` (the layout `python -m atr_grpo.evaluate` writes). Everything else is the run's own
evaluation: the model, the prompt, the task, the problems, n, K, max_tokens and the draws, which under
`eval.seed_by_step` come from (eval.seed, the final step), so the methods of one seed share them. The results
commands read the folder as the run's evaluations (`Run.evaluated_again`) for the plan's final-evaluation test.

A run evaluated before under the same request is read back and said once; a folder holding another request is
refused (`evaluation/store.py`); a run that has not finished, or whose final adapter is gone, is named and
counted, and the command then exits 1. `make reproduce-power3` runs it between training and the tables.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.reporting.plan import FinalEvaluation, PlanError, default_path, load_plan
from atr_grpo.rundir import layout, records

# the run's eval settings that describe how it evaluated during training, not what: a standalone evaluation
# evaluates after training, on its own
STANDALONE = {"when": "after", "share_start": False, "keep_adapters": False}


def final_config(run: Path, final: FinalEvaluation) -> Any:
    """The `EvaluateConfig` of `run`'s final evaluation, checked; ValueError naming what is missing."""
    from omegaconf import OmegaConf

    from atr_grpo.config import EvaluateConfig
    from atr_grpo.config_hydra import register_configs, to_object

    config = rundir.load_config(layout.config_path(run), resolve=False)
    done = records.read_done(run)
    if done is None:
        raise ValueError(f"{run}: not finished (no {layout.DONE_FILE})")
    adapter = run / layout.FINAL_ADAPTER
    if not adapter.is_dir():
        raise ValueError(f"{run}: no {layout.FINAL_ADAPTER}/ to evaluate")
    register_configs()
    settings = {
        "model": config["model"],
        "prompt": config["prompt"],
        "data": config["data"],
        "eval": {**config["eval"], **STANDALONE, "temperature": final.temperature, "top_p": final.top_p},
        "adapter": str(adapter),
        "out_dir": str(run / final.folder),
        "step": done.step,
        "experiment": config["experiment"],
        "study": rundir.study_of(config),
        "method": config.get("method") or "final",
    }
    return to_object(OmegaConf.merge(OmegaConf.structured(EvaluateConfig), settings))


def evaluate_run(run: Path, final: FinalEvaluation, threads: int) -> str:
    """Evaluate one run's final adapter; a line that says what was done."""
    import torch

    from atr_grpo.evaluate import evaluate
    from atr_grpo.reporting.metric import Metric

    torch.set_num_threads(threads)
    cfg = final_config(run, final)
    metrics = evaluate(cfg)
    mean = metrics.get(f"eval/average/{Metric('mean', cfg.eval.k)}")
    shown = "–" if mean is None else f"{100 * mean:.2f} %"
    sampling = f"temperature {final.temperature:g}, top-p {final.top_p:g}"
    return f"{run.name}: step {cfg.step} at {sampling}: Mean@{cfg.eval.k} {shown}"


def evaluated(run: Path, final: FinalEvaluation, step: int) -> bool:
    """Whether `<run>/<folder>/` holds the final evaluation already: every benchmark of the run at `step`, sampled
    at the plan's temperature and top-p. It is read back without its adapter (a clone has no weights)."""
    from atr_grpo.evaluation import store
    from atr_grpo.evaluation.outputs import read_summary

    folder = run / final.folder
    request = store.read_request(folder)
    if request is None:
        return False
    config = rundir.load_config(layout.config_path(run), resolve=False)
    summary = read_summary(folder)
    sampled = (request.get("eval.temperature"), request.get("eval.top_p")) == (final.temperature, final.top_p)
    return sampled and all((step, name) in summary for name in config["eval"]["benchmarks"])


def training_runs(runs: Path, experiment: str) -> list[Path]:
    """The training runs of `experiment` under `runs`."""
    found = []
    for path in layout.find_run_dirs(runs):
        config = rundir.load_config(layout.config_path(path), resolve=False)
        if config.get("experiment") == experiment and isinstance(config.get("trainer"), dict):
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m atr_grpo.final_eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=Path, required=True, help="the experiment's run folder (results/NAME/runs)")
    parser.add_argument("--plan", type=Path, default=None, help="the analysis plan (default: plan.yaml beside --runs)")
    parser.add_argument("--jobs", type=int, default=1, help="runs evaluated at once, one thread each (default 1)")
    opts = parser.parse_args(argv)
    if opts.jobs < 1:
        parser.error(f"--jobs {opts.jobs}: expected an integer >= 1")
    if not opts.runs.is_dir():
        parser.error(f"--runs {opts.runs} is not a directory")
    try:
        plan = load_plan(opts.plan or default_path(opts.runs))
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    final = plan.final_evaluation
    if final is None:
        print(f"error: {plan.path}: the plan has no final_evaluation key; nothing to evaluate", file=sys.stderr)
        return 2
    runs = training_runs(opts.runs, plan.experiment)
    ready, kept, skipped = [], [], []
    for run in runs:
        done = records.read_done(run)
        if done is not None and evaluated(run, final, done.step):
            kept.append(run)
        elif done is None or not (run / layout.FINAL_ADAPTER).is_dir():
            skipped.append(run)
            why = "not finished" if done is None else f"no {layout.FINAL_ADAPTER}/ to evaluate"
            print(f"skipped: {run.name}: {why}", file=sys.stderr)
        else:
            ready.append(run)
    print(
        f"{plan.experiment}: the final evaluation ({final.describe()}) of {len(ready)} runs; {len(kept)} evaluated "
        "before, kept"
    )
    failed = 0
    threads = 1 if opts.jobs > 1 else 0
    spawn = multiprocessing.get_context("spawn")  # workers import torch afresh
    with ProcessPoolExecutor(opts.jobs, mp_context=spawn) if opts.jobs > 1 else _InProcess() as pool:
        futures = [(run, pool.submit(evaluate_run, run, final, threads or _all_threads())) for run in ready]
        for run, future in futures:
            try:
                print(future.result(), flush=True)
            except (ValueError, SystemExit) as err:  # a refused request names the key and both values
                failed += 1
                where = (
                    f" (out_dir is the plan's final_evaluation.folder, {final.folder})" if "out_dir" in str(err) else ""
                )
                print(f"failed: {run.name}: {err}{where}", file=sys.stderr, flush=True)
    done = len(ready) - failed + len(kept)
    print(f"{plan.experiment}: {done} of {len(runs)} runs evaluated in {final.folder}/", flush=True)
    return 1 if failed or skipped else 0


def _all_threads() -> int:
    import torch

    return torch.get_num_threads()


class _InProcess:
    """`submit` runs the call at once, in this process (one job: no worker to start)."""

    def __enter__(self) -> _InProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Any, *args: Any) -> Any:
        from concurrent.futures import Future

        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as err:  # handed to the caller, as a pool's future does; Ctrl-C is not caught
            future.set_exception(err)
        return future


if __name__ == "__main__":
    sys.exit(main())
