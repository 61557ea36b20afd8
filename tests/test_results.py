"""Tables and figures from made-up run directories: the values of "final (best)", Average, mean ± std over seeds,
Pass@K curves, the missing-evaluation report, the comparison with the paper and every figure file."""

from __future__ import annotations

import csv
import json
import math
from itertools import combinations

import pytest
from omegaconf import OmegaConf

from atr_grpo.reporting import tables
from atr_grpo.reporting.runs import find_runs
from atr_grpo.results import main

BENCHES = ["amc23", "aime24", "aime25"]


def make_run(root, experiment, model, method, clipping, seed, evals, metrics=None, max_steps=100, n=8, k=8):
    """A run directory with config.yaml, eval/summary.jsonl ({step: {bench: (mean, pass)}}) and metrics.jsonl."""
    path = root / experiment / f"{experiment}__{method}__{model}__s{seed}"
    path.mkdir(parents=True)
    config = {"experiment": experiment, "seed": seed, "method": method, "model": {"name": model},
              "clipping": clipping, "eval": {"benchmarks": BENCHES, "k": k, "n": n},
              "trainer": {"max_steps": max_steps}}  # fmt: skip
    OmegaConf.save(OmegaConf.create(config), path / "config.yaml")
    lines = []
    for step, values in evals.items():
        for bench, (mean, passk) in values.items():
            lines.append({"step": step, "benchmark": bench, "num_problems": 30, "n": n, f"mean@{k}": mean,
                          f"pass@{k}": passk})  # fmt: skip
    if lines:
        (path / "eval").mkdir()
        (path / "eval" / "summary.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = metrics or [{"step": s, "reward": 0.1 * s, "entropy": 1.0 - 0.01 * s, "completion_length": 100 + s,
                        "clip/frac": 0.01, "ratio/mean": 1.0, "ratio/min": 0.5, "ratio/max": 2.0}
                       for s in range(1, max_steps + 1)]  # fmt: skip
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def evals_of(table):
    """{step: (amc, aime24, aime25)} → summary values (mean, pass) with pass = mean + 0.2."""
    return {s: {b: (v, min(v + 0.2, 1.0)) for b, v in zip(BENCHES, vals)} for s, vals in table.items()}


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "runs"
    # bests on different steps: amc best at 50, aime24 best at 100; the Average's best is step 50's average
    make_run(root, "table2", "qwen3-1.7b", "atr", {"name": "atr", "delta": 0.07}, 0,
             evals_of({0: (0.10, 0.01, 0.02), 50: (0.50, 0.10, 0.20), 100: (0.40, 0.16, 0.18)}))  # fmt: skip
    make_run(root, "table2", "qwen3-1.7b", "clip", {"name": "clip", "eps": 0.2}, 0,
             evals_of({0: (0.10, 0.01, 0.02), 50: (0.30, 0.05, 0.05), 100: (0.35, 0.06, 0.04)}))  # fmt: skip
    make_run(root, "table2", "qwen3-1.7b", "sapo", {"name": "sapo"}, 0, {})  # crashed before evaluating
    make_run(
        root, "table2", "qwen3-8b", "atr", {"name": "atr", "delta": 0.07}, 0, evals_of({50: (0.6, 0.2, 0.2)})
    )  # fmt: skip  (stopped at 50 of 100 steps)
    for seed, finals in enumerate([(0.40, 0.10, 0.10), (0.44, 0.12, 0.08), (0.42, 0.14, 0.12)]):
        make_run(root, "table3", "qwen3-1.7b", "atr", {"name": "atr", "delta": 0.07}, seed,
                 evals_of({50: (0.3, 0.1, 0.1), 100: finals}))  # fmt: skip
    for eps, level in ((0.1, 0.30), (0.3, 0.36), (0.5, 0.33)):
        for seed in range(2):
            make_run(root, "table3", "qwen3-1.7b", f"clip-eps{eps:g}", {"name": "clip", "eps": eps}, seed,
                     evals_of({100: (level + 0.02 * seed, 0.1, 0.1)}))  # fmt: skip
    for delta, level in ((0.05, 0.20), (0.07, 0.26), (0.09, 0.22)):
        make_run(root, "ablate_delta", "qwen3-1.7b", f"atr-delta{delta:g}", {"name": "atr", "delta": delta}, 0,
                 evals_of({100: (level, level, level)}))  # fmt: skip
    return root


def read_csv(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


def cell(rows, **where):
    found = [r for r in rows if all(r[k] == v for k, v in where.items())]
    assert len(found) == 1, (where, found)
    return found[0]


def test_table2_final_best_and_average(tree, tmp_path):
    out = tmp_path / "tables"
    assert main(["table2", "--runs", str(tree), "--out", str(out)]) == 0
    rows = read_csv(out / "table2.csv")
    assert list(rows[0]) == ["model", "method", "benchmark", "metric", "final", "best"]
    amc = cell(rows, model="qwen3-1.7b", method="atr", benchmark="amc23", metric="mean@8")
    assert (amc["final"], amc["best"]) == ("40.00", "50.00")  # step 0 (the start) is not a candidate for best
    aime = cell(rows, model="qwen3-1.7b", method="atr", benchmark="aime24", metric="mean@8")
    assert (aime["final"], aime["best"]) == ("16.00", "16.00")
    avg = cell(rows, model="qwen3-1.7b", method="atr", benchmark="average", metric="mean@8")
    final_avg, step50_avg = (40 + 16 + 18) / 3, (50 + 10 + 20) / 3
    assert (float(avg["final"]), float(avg["best"])) == (round(final_avg, 2), round(step50_avg, 2))
    assert float(avg["best"]) < (50 + 16 + 20) / 3  # not the mean of per-benchmark bests
    passk = cell(rows, model="qwen3-1.7b", method="clip", benchmark="amc23", metric="pass@8")
    assert passk["final"] == "55.00"
    md = (out / "table2.md").read_text()
    assert "| qwen3-1.7b | atr | 40.00 (50.00)" in md
    assert "## Missing evaluations" in md and "sapo" in md and "no evaluation" in md
    assert "last evaluation at step 50 < trainer.max_steps = 100" in md
    tex = (out / "table2.tex").read_text()
    assert r"\begin{tabular}" in tex and "40.00 (50.00)" in tex
    vs = (out / "table2_vs_paper.md").read_text()
    assert "| qwen3-1.7b | atr | amc23 | mean@8 | 40.00 | 41.72 | -1.72 |" in vs


def test_table3_mean_std_over_seeds_and_the_tuned_clip_row(tree, tmp_path):
    out = tmp_path / "tables"
    assert main(["table3", "--runs", str(tree), "--out", str(out)]) == 0
    rows = read_csv(out / "table3.csv")
    assert list(rows[0]) == ["model", "method", "benchmark", "metric", "mean", "std", "n_seeds"]
    amc = cell(rows, method="atr", benchmark="amc23", metric="mean@8")
    values = [40.0, 44.0, 42.0]
    mean = sum(values) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)  # ddof = 1
    assert (float(amc["mean"]), float(amc["std"]), amc["n_seeds"]) == (round(mean, 2), round(std, 2), "3")
    tuned = cell(rows, method="clip-tuned", benchmark="amc23", metric="mean@8")
    assert float(tuned["mean"]) == 37.0  # ε = 0.3: (36 + 38) / 2, the best of 0.1, 0.3, 0.5
    md = (out / "table3.md").read_text()
    assert f"{mean:.2f} ± {std:.2f}" in md and "clip-tuned = clip with ε = 0.3" in md


def test_delta_table(tree, tmp_path):
    assert main(["delta", "--runs", str(tree), "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / "delta.csv")
    assert [(r["delta"], r["mean@8"]) for r in rows] == [("0.05", "20.00"), ("0.07", "26.00"), ("0.09", "22.00")]


def test_passk_curve_matches_brute_force(tmp_path):
    """Pass@K from n samples is the fraction of K-subsets with a correct sample (exhaustive check, n = 6)."""
    root = tmp_path / "runs"
    correct = {"amc23": [[1, 0, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0]], "aime24": [[0] * 6, [0, 0, 0, 0, 0, 1]],
               "aime25": [[1] * 6, [0, 1, 0, 0, 0, 0]]}  # fmt: skip
    path = make_run(root, "passk_curve", "qwen3-1.7b", "atr", {"name": "atr"}, 0,
                    evals_of({1000: (0.2, 0.2, 0.2)}), max_steps=1000, n=6, k=6)  # fmt: skip
    for bench, matrix in correct.items():
        step_dir = path / "eval" / "step_001000"
        step_dir.mkdir(parents=True, exist_ok=True)
        records = [{"problem_id": p, "sample": i, "correct": bool(c)} for p, row in enumerate(matrix)
                   for i, c in enumerate(row)]  # fmt: skip
        (step_dir / f"{bench}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = tables.passk_table(find_runs(root, "passk_curve"))

    def brute(row, k):
        return sum(any(row[i] for i in subset) for subset in combinations(range(6), k)) / math.comb(6, k)

    for k in range(1, 7):
        expected = sum(brute(row, k) for m in correct.values() for row in m) / 6
        got = next(r for r in table.rows if r["benchmark"] == "average" and r["k"] == k)
        assert got["pass@k"] == round(100 * expected, 2)
        first_k = sum(sum(row[:k]) / k for m in correct.values() for row in m) / 6
        assert got["mean@k"] == round(100 * first_k, 2)


def test_figures_are_written(tree, tmp_path):
    out = tmp_path / "figures"
    assert main(["figures", "--runs", str(tree), "--out", str(out)]) == 0
    for name in ("figure1_kl3_bounds", "figure2_training_curves", "clipping_curves", "figure3_delta"):
        for ext in ("png", "pdf"):
            assert (out / f"{name}.{ext}").stat().st_size > 1000, name


def test_bad_requests_fail_clearly(tree, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["table9", "--runs", str(tree)])
    assert "allowed: table2, table3, delta, passk, all, figures" in capsys.readouterr().err
    assert main(["passk", "--runs", str(tree), "--out", str(tmp_path)]) == 2
    assert "no run directories of experiment 'passk_curve'" in capsys.readouterr().err
