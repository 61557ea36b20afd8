"""Evaluation during training: the evaluator called every `eval.every_steps` steps, at the end, and at step 0.

HF `generate` on the live model (TRL path), or the colocated vLLM engine with the live adapter (Unsloth
path). Generation runs under a forked RNG, so evaluating never changes the training run's random stream
(a run with evaluation samples the same rollouts as one without).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from atr_grpo.config import EvalConfig, TrainConfig

log = logging.getLogger(__name__)


def sampling_config(eval_cfg: EvalConfig) -> Any:
    from atr_grpo.evaluation import SamplingConfig

    return SamplingConfig(
        n=eval_cfg.n,
        temperature=eval_cfg.temperature,
        top_p=eval_cfg.top_p,
        top_k=eval_cfg.top_k,
        max_tokens=eval_cfg.max_tokens,
        seed=eval_cfg.seed,
    )


def load_benchmarks(eval_cfg: EvalConfig, data: Any = None) -> list[Any]:
    """The configured benchmarks; `arithmetic` is generated from the data config when one is given."""
    from atr_grpo.data.arithmetic import register_arithmetic_benchmark
    from atr_grpo.evaluation import load_benchmark

    if "arithmetic" in eval_cfg.benchmarks and data is not None and data.name == "arithmetic":
        register_arithmetic_benchmark(
            data.num_train, data.num_eval, data.max_operand, data.operations, data.generator_seed
        )
    return [
        load_benchmark(name, eval_cfg.paths.get(name), eval_cfg.max_problems, eval_cfg.strict)
        for name in eval_cfg.benchmarks
    ]


def build_eval_callback(
    cfg: TrainConfig, trainer: Any, tokenizer: Any, run_dir: Path, logger: Any, backend: str
) -> Any:
    from atr_grpo.evaluation import HFGenerator, UnslothVLLMGenerator, run_evaluation
    from atr_grpo.evaluation.callback import EvaluationCallback

    ev = cfg.eval
    benchmarks: list[Any] = []
    use_vllm = backend == "unsloth" and ev.backend in ("auto", "vllm")
    if ev.backend == "vllm" and not use_vllm:
        log.warning("eval.backend=vllm inside training needs the Unsloth backend; using HF generate")

    def evaluate(step: int) -> dict[str, float]:
        if not benchmarks:
            benchmarks.extend(load_benchmarks(ev, cfg.data))
        if use_vllm:
            generator = UnslothVLLMGenerator(trainer.model, run_dir / "eval_lora")
        else:
            generator = HFGenerator(trainer.model, tokenizer, ev.batch_size, show_progress=False)
        with torch.random.fork_rng(devices=[]):
            return run_evaluation(
                generator,
                tokenizer,
                benchmarks,
                sampling_config(ev),
                run_dir,
                step,
                system_prompt=cfg.prompt.system,
                enable_thinking=cfg.prompt.enable_thinking,
                k=ev.k,
                grader_workers=ev.grader_workers,
                grader_timeout=ev.grader_timeout,
                metadata={"model": cfg.model.name, "method": cfg.method, "seed": cfg.seed},
            )

    return EvaluationCallback(evaluate, ev.every_steps, at_start=ev.at_start, log_fn=logger.log_eval)
