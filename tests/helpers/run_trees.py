"""Made-up run directories for the tables' tests, and the reading of the tables they give: a run is config.yaml,
metrics.jsonl and eval/summary.jsonl, with the values each test chooses."""

from __future__ import annotations

import csv
import json

from omegaconf import OmegaConf

BENCHES = ["amc23", "aime24", "aime25"]


def make_run(
    root, experiment, model, method, clipping, seed, evals, max_steps=100, n=8, k=8, name=None, benchmarks=BENCHES
):
    """A run directory: config.yaml, metrics.jsonl and eval/summary.jsonl from {step: {bench: (mean, pass)}}."""
    path = root / experiment / (name or f"{experiment}__{method}__s{seed}__model={model}")
    path.mkdir(parents=True)
    config = {
        "experiment": experiment,
        "seed": seed,
        "method": method,
        "model": {"name": model},
        "clipping": clipping,
        "trainer": {"max_steps": max_steps},
        "eval": {"benchmarks": list(benchmarks), "k": k, "n": n, "every_steps": 50, "at_start": 0 in evals},
    }
    OmegaConf.save(OmegaConf.create(config), path / "config.yaml")
    lines = [
        {"step": step, "benchmark": bench, "num_problems": 30, "n": n, f"mean@{k}": mean, f"pass@{k}": passk}
        for step, values in evals.items()
        for bench, (mean, passk) in values.items()
    ]
    if lines:
        (path / "eval").mkdir()
        (path / "eval" / "summary.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = [
        {
            "step": s,
            "reward": 0.01 * s,
            "entropy": 1.0 - 0.005 * s,
            "completion_length": 100.0 + s,
            "clip/frac": 0.01,
            "ratio/mean": 1.0,
            "ratio/min": 0.5,
            "ratio/max": 2.0,
        }
        for s in range(1, (max_steps or 0) + 1)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evals_of(table):
    """{step: (amc, aime24, aime25) Mean@8} → summary values (mean, pass) with Pass@8 = Mean@8 + 0.2."""
    return {s: {b: (v, round(min(v + 0.2, 1.0), 6)) for b, v in zip(BENCHES, vals)} for s, vals in table.items()}


def read_csv(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


def cell(rows, **where):
    found = [r for r in rows if all(r[k] == v for k, v in where.items())]
    assert len(found) == 1, (where, found)
    return found[0]


def write_passk_run(root, correct):
    path = make_run(
        root,
        "passk_curve",
        "qwen3-1.7b",
        "atr",
        {"name": "atr"},
        0,
        evals_of({1000: (0.2, 0.2, 0.2)}),
        max_steps=None,
        n=6,
        k=6,
    )
    step_dir = path / "eval" / "step_001000"
    step_dir.mkdir(parents=True)
    for bench, matrix in correct.items():
        records = [
            {"problem_id": p, "sample": i, "correct": bool(c)}
            for p, row in enumerate(matrix)
            for i, c in enumerate(row)
        ]
        (step_dir / f"{bench}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
