"""The committed CPU experiment with power (`make reproduce-power`, results/power/) is what its run files say,
and it meets the design it was run for.

The runs are 4 methods × 10 seeds from one start point, every sample kept (gzipped, no weights); every run writes
reasoning chains (mean completion length ≥ 48 tokens), clip and atr act (mean clip/frac ≥ 1 %) and step 0 is
neither trivial nor saturated; every method's AUC is above it on average. The tables rebuild byte for byte, `compare`
prints the seeds_auc table's numbers, and the minimum detectable effects and evaluation noise quoted in
docs/experiment-log.md are what the committed runs give.
"""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
from conftest import REPO
from helpers.committed_results import assert_tables_rebuild, kept_by_git, table_cells

from atr_grpo import results
from atr_grpo.reporting import stats
from atr_grpo.reporting.analyses import compare
from atr_grpo.reporting.runs import find_runs

POWER = REPO / "results" / "power"
RUNS = POWER / "runs"
TABLES = POWER / "tables"
METHODS = ("clip", "clip_higher", "atr", "gspo")
SEEDS = tuple(range(10))
EVAL_STEPS = [0, 32, 64, 96, 128]


def _rows(name):
    with (TABLES / f"{name}.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_the_committed_runs_are_the_plans_runs_from_one_start_point_without_weights():
    names = sorted(path.name for path in RUNS.iterdir() if path.is_dir())
    assert names == sorted(f"power__{m}__s{s}" for m in METHODS for s in SEEDS)
    starts = set()
    for run in names:
        files = kept_by_git(RUNS / run)
        assert {"config.yaml", "env.json", "metrics.jsonl", "eval/summary.jsonl"} <= set(files), run
        steps = [json.loads(line)["step"] for line in (RUNS / run / "eval" / "summary.jsonl").open()]
        assert steps == EVAL_STEPS, run
        assert [f for f in files if f.startswith("eval/step_")] == [
            f"eval/step_{step:06d}/arithmetic.jsonl.gz" for step in steps
        ], run
        assert not [f for f in files if f.endswith((".safetensors", ".bin", ".pt", ".pth"))], run
        start = json.loads((RUNS / run / "env.json").read_text())["start_point"]
        starts.add((start["base_model_sha256"], start["sft_adapter"], start["sft_adapter_sha256"]))
    assert len(starts) == 1  # one base model and one SFT adapter, by their weights' sha256


def test_the_experiment_meets_its_design():
    bounds = _rows("bounds")
    assert len(bounds) == len(METHODS) * len(SEEDS)
    for row in bounds:
        assert float(row["completion_length"]) >= 48, row  # reasoning chains, in every run
    for method in ("clip", "atr"):
        fracs = [float(r["clip_frac"]) for r in bounds if r["method"] == method]
        assert sum(fracs) / len(fracs) >= 0.01, method  # the rule acts
    gained = set()
    for row in _rows("endpoints"):
        if row["metric"] == "mean@8":
            assert int(row["seeds"]) == 10
            assert 5 <= float(row["start"]) <= 50, row  # neither trivial nor saturated
            if float(row["auc"]) > float(row["start"]):
                gained.add(row["method"])
    assert gained == set(METHODS)  # every method learns on the SFT adapter: a difference means "learns more"


@pytest.mark.slow
def test_the_committed_tables_rebuild_byte_for_byte(tmp_path):
    required = {"seeds.csv", "seeds_auc.csv", "seeds_auc.md", "endpoints.csv", "bounds.csv"}
    assert_tables_rebuild(RUNS, "power", TABLES, tmp_path / "tables", required)


def test_compare_prints_the_seeds_auc_tables_numbers(capsys):
    """The primary comparison: atr − clip on Mean@8's AUC, every seed-level cell as the committed table has it."""
    argv = ["compare", "atr", "clip", "--runs", str(RUNS), "--experiment", "power", "--endpoint", "auc"]
    assert results.main([*argv, "--metric", "mean@8", "--benchmark", "arithmetic"]) == 0
    out = capsys.readouterr().out
    assert "(seeds 0, 1, 2, 3, 4, 5, 6, 7, 8, 9; AUC: each run’s mean over its evaluation steps 32, 64, 96, 128)" in out
    seed_level, robust = (table_cells(line) for line in out.splitlines() if line.startswith("| arithmetic | mean@8 |"))
    (row,) = (
        table_cells(line)
        for line in (TABLES / "seeds_auc.md").read_text().splitlines()
        if line.startswith("| tiny | atr | arithmetic | mean@8 |")
    )
    assert row[7:17] == seed_level[4:14]  # difference, per seed, t-interval, p, smallest p, Holm p, †, t p, MDE, power
    assert row[17:20] == robust[4:7] and row[6] == robust[2]  # P(A > B), its interval, p (problems); IQM
    assert seed_level[8] == "0.00195"  # the smallest p 10 seed pairs allow: 2 / 2^10


def _pooled_mde():
    """(t.975 + t.80) · SD_d / √S at α 0.05 alone, SD_d the SD of the per-seed AUC differences to clip pooled over
    the methods, from the exact per-seed differences (the CSV's are rounded to 2 decimals)."""
    runs = find_runs(RUNS)
    variances = []
    for method in METHODS[1:]:
        (row,) = compare.compare_methods(
            runs, method, "clip", stats.Resampling(200), ["arithmetic"], ["mean@8"], endpoint="auc"
        )
        variances.append(row.difference.sd**2)
    return float(stats.minimum_detectable_effect(math.sqrt(sum(variances) / len(variances)), len(SEEDS), 0.05))


def test_the_documented_minimum_detectable_effect_is_the_committed_runs():
    """The docs print the pooled MDE, labelled pooled, to 2 decimals: the quote is that rounding, exactly."""
    text = (REPO / "docs" / "experiment-log.md").read_text()
    words = r"pooled MDE \(beside the per-comparison ones; α 0.05 alone\) is ([0-9.]+) points"
    quoted = re.search(words.replace(" ", r"\s+"), text)
    assert quoted, "docs/experiment-log.md quotes the pooled MDE"
    mde = _pooled_mde()
    assert quoted.group(1) == f"{mde:.2f}"
    assert mde <= 2.0  # the design's target


def test_the_documented_per_comparison_mdes_are_the_committed_tables():
    """Each method's MDE in the docs' AUC table is its own, at the level of its test (seeds_auc's mde_vs_clip)."""
    text = (REPO / "docs" / "experiment-log.md").read_text()
    for row in _rows("seeds_auc"):
        if row["metric"] == "mean@8" and row["method"] != "clip":
            line = next(x for x in text.splitlines() if x.startswith(f"| {row['method']} ") and "of 10 |" in x)
            assert table_cells(line)[6] == row["mde_vs_clip"], row["method"]


def test_the_documented_evaluation_noise_is_the_committed_runs():
    """The docs quote each comparison's evaluation noise beside its seed SD, as `compare` computes them, to 2
    decimals."""
    text = " ".join((REPO / "docs" / "experiment-log.md").read_text().split())
    runs = find_runs(RUNS)
    noise, spread = [], []
    for method in ("atr", "clip_higher", "gspo"):
        (row,) = compare.compare_methods(
            runs, method, "clip", stats.Resampling(200), ["arithmetic"], ["mean@8"], endpoint="auc"
        )
        noise.append(f"{row.evaluation_sd:.2f}")
        spread.append(f"{row.difference.sd:.2f}")
    quoted = (
        f"is {noise[0]} points for atr, {noise[1]} for clip_higher and {noise[2]} for gspo, against seed SDs of the "
        f"differences of {spread[0]}, {spread[1]} and {spread[2]}"
    )
    assert quoted in text
