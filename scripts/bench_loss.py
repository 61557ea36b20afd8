"""`make bench-loss`: forward + backward time of every registered rule plus Dr.GRPO aggregation, against `clip`.

Per-token inputs of one GRPO micro-batch (B = 32 sequences, T = 2048 tokens, fp32, CPU): log-probs that
require grad, stale π_old log-probs, advantages, a ragged completion mask, and the rule's extras from their
fixtures (`clipping.extras`: `full_kl` gets a per-token KL, its vocabulary pass is the trainer's, not the rule's).
Rules are timed in interleaved rounds (every rule once per round, in a shuffled order) so that machine noise hits
all of them alike; the table
reports the median over rounds and its ratio to `clip`. Targets by the rule's family: covariance rules, which
also select tokens over the whole batch, ≤ 1.30× `clip`; every other rule ≤ 1.10× `clip`.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time

import torch

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.clipping.extras import fixture_extras
from atr_grpo.losses import aggregate
from atr_grpo.plugins import load_rule_plugins

# The cost target of each family, as a multiple of `clip`'s time (None: reported as measured). Every family not
# listed is a handful of elementwise ops on the ratio, with the 1.10× target; the covariance rules also compute
# the batch covariance and select a few tokens by a partial top-k (Clip-Cov: of per-token hashed keys).
FAMILY_TARGETS: dict[str, float | None] = {"covariance": 1.30}
DEFAULT_TARGET = 1.10


def target_of(name: str) -> float | None:
    return FAMILY_TARGETS.get(RULES[name].family, DEFAULT_TARGET)


def chosen_rules(names: str | None) -> list[str]:
    """The rules to time, sorted: every registered rule, or the comma-separated `names` and `clip` (the baseline)."""
    if names is None:
        return sorted(RULES)
    chosen = {name.strip() for name in names.split(",") if name.strip()}
    unknown = sorted(chosen - set(RULES))
    if unknown:
        raise SystemExit(f"--rules: unknown rule(s) {', '.join(unknown)}; allowed: {', '.join(sorted(RULES))}")
    return sorted(chosen | {"clip"})


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
    }


def step(rule: object, inputs: dict[str, torch.Tensor], max_len: int, extras: dict[str, object]) -> None:
    logp = inputs["logp"]
    logp.grad = None
    out = rule(logp, inputs["old"], inputs["advantages"], inputs["mask"], **extras)
    aggregate(out.loss, inputs["mask"], "dr_grpo", max_len).backward()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="a small size and few rounds (a smoke check)")
    parser.add_argument(
        "--rules",
        default=None,
        help="comma-separated rules to time (default: every registered rule); clip is always in",
    )
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.batch, opts.steps, opts.rounds = 4, 256, 3
    if opts.threads:
        torch.set_num_threads(opts.threads)

    inputs = make_inputs(opts.batch, opts.steps)
    load_rule_plugins()  # installed packages' rules are timed too
    rules = {name: build_rule(name) for name in chosen_rules(opts.rules)}
    extras = {
        name: fixture_extras(rule.needs, inputs["old"], seed=1, owns_correction=rule.owns_correction)
        for name, rule in rules.items()
    }
    for name, rule in rules.items():  # warm-up: allocator, first-call overheads
        step(rule, inputs, opts.steps, extras[name])
    times: dict[str, list[float]] = {name: [] for name in rules}
    order = list(rules)
    shuffler = random.Random(0)
    for _ in range(opts.rounds):
        shuffler.shuffle(order)
        for name in order:
            started = time.perf_counter()
            step(rules[name], inputs, opts.steps, extras[name])
            times[name].append(time.perf_counter() - started)

    base = statistics.median(times["clip"])
    print(
        f"forward + backward + dr_grpo aggregation, B = {opts.batch}, T = {opts.steps}, fp32, CPU, "
        f"{torch.get_num_threads()} threads, median of {opts.rounds} interleaved rounds"
    )
    print("| rule | median (ms) | × clip | target |")
    print("|---|---:|---:|---|")
    over = []
    for name in sorted(rules, key=lambda n: (target_of(n) or math.inf, n)):
        median = statistics.median(times[name])
        ratio = median / base
        target = target_of(name)
        if target is None:
            verdict = "reported"
        else:
            verdict = f"≤ {target:.2f}×: " + ("ok" if ratio <= target else "over")
            if ratio > target:
                over.append(name)
        print(f"| {name} | {median * 1e3:.1f} | {ratio:.2f} | {verdict} |")
    print("every rule within its target" if not over else f"over target: {', '.join(over)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
