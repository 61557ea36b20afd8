"""The endpoints table (step 0, final, best and AUC per method over seeds) and the bounds table (per run: completion
length and how often each bound fired), on runs whose values are known exactly."""

from __future__ import annotations

import json
import math

import pytest
from helpers.run_trees import BENCHES, make_run

from atr_grpo.reporting.analyses.endpoints import bounds_table, endpoints_table
from atr_grpo.reporting.runs import AVERAGE, find_runs


def evals(*per_step):
    """{step: the same (mean, pass) on every benchmark} for steps 0, 50, 100, ..."""
    return {50 * i: dict.fromkeys(BENCHES, (v, v)) for i, v in enumerate(per_step)}


@pytest.fixture
def runs(tmp_path):
    clip = {"name": "clip"}
    make_run(tmp_path, "power", "tiny", "clip", clip, 0, evals(0.10, 0.20, 0.40, 0.30), max_steps=150)
    make_run(tmp_path, "power", "tiny", "clip", clip, 1, evals(0.10, 0.30, 0.30, 0.60), max_steps=150)
    return find_runs(tmp_path)


def test_auc_is_the_mean_after_step_0_and_seeds_are_summarised_with_their_sd(runs):
    rows = {(r["benchmark"], r["metric"]): r for r in endpoints_table(runs).rows}
    row = rows[(AVERAGE, "mean@8")]
    assert row["seeds"] == 2 and row["start"] == pytest.approx(10.0)
    # seed 0: final 30, best 40, AUC (20 + 40 + 30) / 3 = 30; seed 1: final 60, best 60, AUC 40
    assert row["final"] == pytest.approx(45.0) and row["final_sd"] == pytest.approx(math.sqrt(450))
    assert row["best"] == pytest.approx(50.0)
    assert row["auc"] == pytest.approx(35.0) and row["auc_sd"] == pytest.approx(math.sqrt(50))
    assert row["auc_minus_start"] == pytest.approx(25.0)
    assert {b for b, _ in rows} == {*BENCHES, AVERAGE}


def test_bounds_table_counts_the_steps_each_bound_fired(tmp_path):
    path = make_run(tmp_path, "power", "tiny", "dual_clip", {"name": "dual_clip"}, 0, evals(0.1, 0.2), max_steps=4)
    rows = [
        {"step": 1, "completion_length": 50.0, "clip/frac": 0.0, "clip/frac_low": 0.0, "clip/frac_dual": 0.0},
        {"step": 2, "clip/frac": 0.02, "clip/frac_low": 0.02, "clip/frac_dual": 0.0},
        {"step": 3, "completion_length": 70.0, "clip/frac": 0.04, "clip/frac_low": 0.03, "clip/frac_dual": 0.01},
        {"step": 4, "clip/frac": 0.02, "clip/frac_low": 0.02, "clip/frac_dual": 0.0},
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    make_run(tmp_path, "power", "tiny", "clip", {"name": "clip"}, 0, evals(0.1, 0.2), max_steps=4)
    table = bounds_table(find_runs(tmp_path))
    dual = next(r for r in table.rows if r["method"] == "dual_clip")
    assert (dual["steps"], dual["completion_length"], dual["clip_frac"]) == (4, 60.0, 0.02)
    assert (dual["fired_low"], dual["frac_low"]) == (0.75, pytest.approx(0.0175))
    assert (dual["fired_dual"], dual["frac_dual"]) == (0.25, pytest.approx(0.0025))
    clip = next(r for r in table.rows if r["method"] == "clip")
    assert math.isnan(clip["fired_dual"]) and table.nan_text["fired_dual"] == "–"  # clip has no dual bound
