"""`make bench-wait`: how OpenMP's wait policy decides a CPU run's speed when another job shares the cores.

A worker process trains a small stack of 64-wide layers (the tiny model's width: many short parallel regions) for
a fixed number of steps with `--threads` torch threads, and prints its time. For each policy (ACTIVE: idle
OpenMP threads spin; PASSIVE: they sleep) the worker runs alone, then two workers run at once, as two runs of a
sweep or a run beside a test suite do. Rounds alternate the policies, so that machine noise hits both alike;
the table gives the median time and its ratio to PASSIVE alone. `atr_grpo` sets PASSIVE unless the environment
already sets a policy (`atr_grpo/__init__.py`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

POLICIES = ("PASSIVE", "ACTIVE")


def work(threads: int, steps: int) -> float:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 64) for _ in range(8)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.SiLU())])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(16 * 64, 64)
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
    return time.perf_counter() - started


def launch(policy: str, threads: int, steps: int, copies: int) -> list[float]:
    """`copies` workers started together under `policy`; each one's time in seconds."""
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    command = [sys.executable, __file__, "--worker", "--threads", str(threads), "--steps", str(steps)]
    workers = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(copies)]
    times = []
    for worker in workers:
        out, _ = worker.communicate()
        if worker.returncode != 0:
            raise SystemExit(f"a {policy} worker failed with exit status {worker.returncode}")
        times.append(float(out.strip()))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads per worker")
    parser.add_argument("--steps", type=int, default=300, help="training steps per worker")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(work(args.threads, args.steps))
        return 0
    times: dict[tuple[str, int], list[float]] = {(p, c): [] for p in POLICIES for c in (1, 2)}
    for _ in range(args.rounds):
        for policy in POLICIES:
            for copies in (1, 2):
                times[policy, copies] += launch(policy, args.threads, args.steps, copies)
    base = statistics.median(times["PASSIVE", 1])
    print(f"{args.threads} threads per worker, {args.steps} steps, {args.rounds} rounds, {os.cpu_count()} cores\n")
    print("| OMP_WAIT_POLICY | workers at once | median s per worker | × PASSIVE alone |")
    print("|---|---:|---:|---:|")
    for (policy, copies), values in times.items():
        median = statistics.median(values)
        print(f"| {policy} | {copies} | {median:.2f} | {median / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
