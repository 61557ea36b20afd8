"""`make bench-loss`: forward + backward time of every registered rule plus Dr.GRPO aggregation, against `clip`.

Per-token inputs of one GRPO micro-batch (B = 32 sequences, T = 2048 tokens, fp32, CPU): log-probs that
require grad, stale π_old log-probs, advantages, a ragged completion mask; `full_kl` gets a precomputed
per-token KL (its vocabulary pass is the trainer's, not the rule's). Rules are timed in interleaved rounds
(every rule once per round, in a shuffled order) so that machine noise hits all of them alike; the table
reports the median over rounds and its ratio to `clip`. Target: every ratio-based rule ≤ 1.10× `clip`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.losses import aggregate

# Rules whose cost is a handful of elementwise ops on the ratio (the 1.10× target); the others also rank or
# select tokens over the whole batch (Clip-Cov, KL-Cov) and are reported as measured.
RATIO_BASED = ("no_clip", "clip", "clip_higher", "dual_clip", "rpg_clip", "dcpo", "sapo", "atr", "kl1", "kl2",
               "is_kl3", "full_kl")  # fmt: skip


def make_inputs(batch: int, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g) * 4
    logp = (old + torch.randn(batch, steps, generator=g) * 0.3).requires_grad_()
    lengths = torch.randint(steps // 4, steps + 1, (batch,), generator=g)
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    return {
        "logp": logp,
        "old": old,
        "advantages": torch.randn(batch, generator=g),
        "mask": mask,
        "full_kl": torch.rand(batch, steps, generator=g) * 0.1,
    }


def step(rule: object, inputs: dict[str, torch.Tensor], max_len: int) -> None:
    extras: dict[str, object] = {}
    if "generator" in rule.needs:
        extras["generator"] = torch.Generator().manual_seed(1)
    if "full_kl" in rule.needs:
        extras["full_kl"] = inputs["full_kl"]
    logp = inputs["logp"]
    logp.grad = None
    out = rule(logp, inputs["old"], inputs["advantages"], inputs["mask"], **extras)
    aggregate(out.loss, inputs["mask"], "dr_grpo", max_len).backward()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="a small size and few rounds (a smoke check)")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.batch, opts.steps, opts.rounds = 4, 256, 3
    if opts.threads:
        torch.set_num_threads(opts.threads)

    inputs = make_inputs(opts.batch, opts.steps)
    rules = {name: build_rule(name) for name in sorted(RULES)}
    for rule in rules.values():  # warm-up: allocator, first-call overheads
        step(rule, inputs, opts.steps)
    times: dict[str, list[float]] = {name: [] for name in rules}
    order = list(rules)
    shuffler = random.Random(0)
    for _ in range(opts.rounds):
        shuffler.shuffle(order)
        for name in order:
            started = time.perf_counter()
            step(rules[name], inputs, opts.steps)
            times[name].append(time.perf_counter() - started)

    base = statistics.median(times["clip"])
    print(f"forward + backward + dr_grpo aggregation, B = {opts.batch}, T = {opts.steps}, fp32, CPU, "
          f"{torch.get_num_threads()} threads, median of {opts.rounds} interleaved rounds")  # fmt: skip
    print("| rule | median (ms) | × clip | target |")
    print("|---|---:|---:|---|")
    over = []
    for name in sorted(rules, key=lambda n: (n not in RATIO_BASED, n)):
        median = statistics.median(times[name])
        ratio = median / base
        if name in RATIO_BASED:
            verdict = "≤ 1.10×: " + ("ok" if ratio <= 1.10 else "over")
            if ratio > 1.10:
                over.append(name)
        else:
            verdict = "reported"
        print(f"| {name} | {median * 1e3:.1f} | {ratio:.2f} | {verdict} |")
    print("every ratio-based rule within 1.10× clip" if not over else f"over 1.10×: {', '.join(over)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
