"""Made-up run directories for the tables' tests, and the reading of the tables they give: a run is its config,
metrics and evaluation summary, with the values each test chooses, written where and as the product writes them
(`rundir.layout`, `rundir.records`)."""

from __future__ import annotations

import csv

from omegaconf import OmegaConf

from atr_grpo.rundir import files, layout
from atr_grpo.rundir.records import MetricsLine, SampleRecord, SummaryRow

BENCHES = ["amc23", "aime24", "aime25"]


def make_run(
    root, experiment, model, method, clipping, seed, evals, max_steps=100, n=8, k=8, name=None, benchmarks=BENCHES
):
    """A run directory: its config, metrics and evaluation summary from {step: {bench: (mean, pass)}}."""
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
    OmegaConf.save(OmegaConf.create(config), layout.config_path(path))
    lines = [
        SummaryRow(step, bench, {"num_problems": 30, "n": n, f"mean@{k}": mean, f"pass@{k}": passk})
        for step, values in evals.items()
        for bench, (mean, passk) in values.items()
    ]
    if lines:
        files.write_jsonl(layout.summary_path(path), [line.to_dict() for line in lines])
    rows = [
        MetricsLine(
            s,
            {
                "reward": 0.01 * s,
                "entropy": 1.0 - 0.005 * s,
                "completion_length": 100.0 + s,
                "clip/frac": 0.01,
                "ratio/mean": 1.0,
                "ratio/min": 0.5,
                "ratio/max": 2.0,
            },
        )
        for s in range(1, (max_steps or 0) + 1)
    ]
    files.write_jsonl(layout.metrics_path(path), [row.to_dict() for row in rows])
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
    for bench, matrix in correct.items():
        records = [SampleRecord(p, i, bool(c)).to_dict() for p, row in enumerate(matrix) for i, c in enumerate(row)]
        files.write_jsonl(layout.sample_file(path, 1000, bench), records)
    return path


def add_parts(path, answered, k=8):
    """Give every summary line of the run at `path` the parts of its Mean@K: the answered rate `answered` and the
    accuracy given an answer that makes their product Mean@K."""
    lines = files.read_jsonl(layout.summary_path(path))
    for line in lines:
        line[f"answered@{k}"] = answered
        line[f"acc_given_answer@{k}"] = line[f"mean@{k}"] / answered
    files.write_jsonl(layout.summary_path(path), lines)
