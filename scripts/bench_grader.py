"""Grader throughput: 1,144 realistic responses (143 problems × 8), serially and with the worker pool.

    python scripts/bench_grader.py [--workers N] [--timeout S] [--repeat R] [--seed S]

The responses are generated here, deterministically: 1-3 KB of step-by-step reasoning in LaTeX,
ending in a boxed answer of varied form (integers with leading zeros, fractions, decimals, units and
other LaTeX noise), some wrong, some without a box, some truncated. Each mode runs from cold parse
caches, `--repeat` times, alternating; the fastest run of each counts (other processes on a shared
machine only ever slow a run down). Targets (2 cores): the pool at least 1.7× the serial throughput,
and the whole set graded in at most 10 s.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from fractions import Fraction

from atr_grpo.evaluation.gold import parse_gold
from atr_grpo.evaluation.grader import grade_samples, status_counts, usable_cpus

NUM_PROBLEMS, SAMPLES = 143, 8
STEPS = [
    "Let $x$ be the quantity we want. From the statement, $x^2 - {a}x + {b} = 0$.",
    "By Vieta's formulas the roots satisfy $r_1 + r_2 = {a}$ and $r_1 r_2 = {b}$.",
    "We compute $\\frac{{{a}}}{{{c}}} + \\frac{{{b}}}{{{c}}} = \\frac{{{a} + {b}}}{{{c}}}$.",
    "Consider the triangle with sides ${a}$, ${b}$ and ${c}$; by the law of cosines "
    "$\\cos C = \\frac{{a^2 + b^2 - c^2}}{{2ab}}$.",
    "Working modulo ${c}$, we have ${a}^{{{b}}} \\equiv {d} \\pmod{{{c}}}$.",
    "Summing the arithmetic series gives $\\sum_{{k=1}}^{{{a}}} k = \\frac{{{a}({a}+1)}}{{2}}$.",
    "There are $\\binom{{{a}}}{{2}} = {e}$ ways to choose the pair, and we subtract the ${b}$ invalid ones.",
    "Hence the area is $\\frac{{1}}{{2}} \\cdot {a} \\cdot {b} = {f}$ square units.",
    "Wait, let me double-check this step: substituting back gives ${a} + {b} = {g}$, which is consistent.",
    "So the probability is $\\frac{{{b}}}{{{g}}}$, and we simplify by the greatest common divisor.",
]


def make_gold(rng: random.Random, index: int) -> str:
    kind = index % 5
    if kind in (0, 1, 2):  # AIME-style integers
        return str(rng.randint(0, 999))
    if kind == 3:
        num, den = rng.randint(1, 20), rng.randint(2, 21)
        frac = Fraction(num, den)
        return f"\\frac{{{frac.numerator}}}{{{frac.denominator}}}" if frac.denominator != 1 else str(frac.numerator)
    return f"{rng.randint(1, 99)}.{rng.randint(1, 9)}"  # decimals


def answer_forms(gold: str, rng: random.Random) -> str:
    """A correct answer, written the way models write it."""
    if gold.startswith("\\frac"):
        num, den = gold[6:-1].split("}{")
        return rng.choice([gold, f"\\dfrac{{{num}}}{{{den}}}", f"{num}/{den}", f"\\tfrac{{{num}}}{{{den}}}"])
    if "." in gold:
        return rng.choice([gold, f"{gold}0", f"{gold}\\text{{ cm}}", f"\\${gold}"])
    return rng.choice([gold, gold.zfill(3), f"{gold}\\text{{ ways}}", f"\\mathbf{{{gold}}}", f"{gold}^\\circ", gold])


def wrong_answer(gold: str, rng: random.Random) -> str:
    if gold.startswith("\\frac"):
        num, den = gold[6:-1].split("}{")
        return f"\\frac{{{int(num) + 1}}}{{{den}}}"
    if "." in gold:
        return f"{float(gold) + rng.randint(1, 5):.1f}"
    return str(int(gold) + rng.randint(1, 50))


def reasoning(rng: random.Random) -> str:
    target = rng.randint(1000, 3000)
    parts: list[str] = []
    while sum(len(p) for p in parts) < target:
        a, b, c = rng.randint(2, 60), rng.randint(2, 60), rng.randint(2, 60)
        values = {"a": a, "b": b, "c": c, "d": (a**b) % c, "e": a * (a - 1) // 2, "f": a * b / 2, "g": a + b}
        parts.append(rng.choice(STEPS).format(**values))
    return "\n\n".join(parts)


def make_responses(seed: int = 0) -> list[tuple[str, str, str]]:
    """(completion, gold, finish_reason) for 143 × 8 samples: ~60% right, the rest wrong, unboxed or cut."""
    rng = random.Random(seed)
    items = []
    for problem in range(NUM_PROBLEMS):
        gold = make_gold(rng, problem)
        for _ in range(SAMPLES):
            text = reasoning(rng)
            roll = rng.random()
            if roll < 0.60:
                ending = rng.choice(
                    [
                        "Therefore, the final answer is $\\boxed{{{}}}$.",
                        "**Final Answer**\n\\[\\boxed{{{}}}\\]",
                    ]
                )
                items.append((f"{text}\n\n{ending.format(answer_forms(gold, rng))}", gold, "stop"))
            elif roll < 0.80:  # wrong, sometimes after a first (also boxed) attempt
                first = f"A first guess is $\\boxed{{{gold}}}$, but that ignores a case.\n\n" if roll < 0.65 else ""
                items.append(
                    (
                        f"{text}\n\n{first}So the answer is $\\boxed{{{wrong_answer(gold, rng)}}}$.",
                        gold,
                        "stop",
                    )
                )
            elif roll < 0.90:  # no box at all
                items.append((f"{text}\n\nThus the answer is {gold}.", gold, "stop"))
            else:  # cut off by the token limit
                items.append((text[: rng.randint(500, len(text))], gold, "length"))
    return items


def clear_caches() -> None:
    """Start both runs cold: math-verify memoises parses, and forked workers would inherit a warm cache."""
    import math_verify.parser as mv_parser

    parse_gold.cache_clear()
    for name in ("parse_latex_cached", "parse_expr_cached"):
        cached = getattr(mv_parser, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _spin(_: int) -> int:
    total = 0
    for i in range(3_000_000):
        total += i * i
    return total


def machine_ceiling(workers: int) -> float:
    """The speed-up `workers` processes get on a pure-Python loop here now: what any pool can reach."""
    import multiprocessing as mp

    started = time.perf_counter()
    for i in range(workers):
        _spin(i)
    serial_s = time.perf_counter() - started
    with mp.get_context("fork").Pool(workers) as pool:
        started = time.perf_counter()
        pool.map(_spin, range(workers))
        parallel_s = time.perf_counter() - started
    return serial_s / parallel_s


def timed(items: list[tuple[str, str, str]], workers: int, timeout: float) -> tuple[float, list]:
    """Seconds to grade `items` from cold caches, and the results."""
    clear_caches()
    started = time.perf_counter()
    results = grade_samples(items, workers=workers, timeout=timeout)
    return time.perf_counter() - started, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: usable CPUs)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per answer")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mode; the fastest counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    workers = args.workers or usable_cpus()

    items = make_responses(args.seed)
    sizes = [len(c) for c, _, _ in items]
    shape = f"{len(items)} responses ({NUM_PROBLEMS} problems x {SAMPLES})"
    lengths = f"{min(sizes)}-{max(sizes)} chars, mean {sum(sizes) / len(sizes):.0f}"
    print(f"{shape}, {lengths}; {workers} workers on {usable_cpus()} usable CPUs, best of {args.repeat}")
    grade_samples(items[:2], workers=0, timeout=args.timeout)  # imports, outside the timings

    # alternate the modes, so that load from other processes hits both alike
    serial_runs, pool_runs = [], []
    for _ in range(args.repeat):
        serial_runs.append(timed(items, 0, args.timeout))
        pool_runs.append(timed(items, workers, args.timeout))
    serial_s, serial = min(serial_runs, key=lambda run: run[0])
    pool_s, pooled = min(pool_runs, key=lambda run: run[0])
    all_s = ", ".join(f"{s:.2f}/{p:.2f}" for (s, _), (p, _) in zip(serial_runs, pool_runs))

    agree = all([a.status for a in serial] == [b.status for b in run] for _, run in serial_runs + pool_runs)
    ratio = serial_s / pool_s
    print(f"statuses: {status_counts(pooled)}")
    print(f"serial : {serial_s:6.2f} s  {len(items) / serial_s:7.1f} responses/s")
    print(f"pool   : {pool_s:6.2f} s  {len(items) / pool_s:7.1f} responses/s  ({workers} workers)")
    print(f"every run, serial/pool seconds: {all_s}")
    print(f"speed-up pool/serial: {ratio:.2f}x (target >= 1.7x): {'OK' if ratio >= 1.7 else 'MISSED'}")
    ceiling = machine_ceiling(workers)
    print(f"  (ceiling here now: {workers} processes of a pure-Python loop run {ceiling:.2f}x faster than 1)")
    print(f"whole set with the pool: {pool_s:.2f} s (target <= 10 s): {'OK' if pool_s <= 10 else 'MISSED'}")
    print(f"serial and pool verdicts agree: {agree}")
    if not agree:
        diff = Counter((a.status, b.status) for a, b in zip(serial, pooled) if a.status != b.status)
        print(f"disagreements (serial, pool): {dict(diff)}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
