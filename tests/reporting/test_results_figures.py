"""Figures from made-up run directories: every figure is written as a non-empty PNG and PDF, the functions
return exactly what they wrote, figures without data are skipped by name, and the moving average is the
trailing mean over the last `window` steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.run_trees import BENCHES, add_parts, evals_of, make_run, write_passk_run

from atr_grpo.clipping import kl3_ratio_bounds
from atr_grpo.reporting.render import figures
from atr_grpo.reporting.runs import find_runs
from atr_grpo.results import main

ALL = [
    "figure1_kl3_bounds",
    "figure2_training_curves",
    "clipping_curves",
    "parts_curves",
    "figure3_delta",
    "figure4_passk",
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("figures") / "runs"
    for method, clipping in (("clip", {"name": "clip", "eps": 0.2}), ("atr", {"name": "atr", "delta": 0.07})):
        for model in ("qwen3-1.7b", "qwen3-8b"):
            run = make_run(root, "table2", model, method, clipping, 0, evals_of({0: (0.1,) * 3, 50: (0.2,) * 3}), 60)
            add_parts(run, 0.5)
    for delta in (0.05, 0.07):
        make_run(
            root,
            "ablate_delta",
            "qwen3-1.7b",
            f"atr-delta{delta:g}",
            {"name": "atr", "delta": delta},
            0,
            evals_of({50: (delta,) * 3}),
            50,
        )
    write_passk_run(root, {b: [[1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]] for b in BENCHES})
    return root


def assert_written(paths, names):
    assert sorted(p.name for p in paths) == sorted(f"{n}.{ext}" for n in names for ext in ("png", "pdf"))
    for path in paths:
        assert path.stat().st_size > 1000, path


def test_figure1_needs_no_runs(tmp_path):
    assert_written(figures.figure1(tmp_path), ["figure1_kl3_bounds"])


def test_figure1_draws_the_registrys_intervals():
    """Panel (b) has one bar per rule with a ratio interval for all tokens (ATR's from Lambert W, none for the
    sequence-level or soft rules); panel (c) the π_old-dependent bounds of DCPO and DPPO (DPPO-KL: w ≤ 7.81 at
    π_old = 0.01)."""
    rows = {name: (low, high) for name, low, high in figures.rule_intervals()}
    assert rows["atr"] == pytest.approx(kl3_ratio_bounds(0.07)) and rows["clip"] == pytest.approx((0.8, 1.2))
    assert not {"gspo", "sapo", "no_clip", "atr_seq", "dcpo"} & set(rows)
    curves = figures.rule_old_prob_bounds([0.01, 0.5])
    assert {"dcpo", "dppo_tv", "dppo_kl"} <= set(curves)
    assert curves["dppo_kl"][1][0] == pytest.approx(7.81, abs=0.01) and curves["dppo_tv"][0][1] == pytest.approx(0.7)


@pytest.mark.slow
def test_figures_command_writes_every_figure(tree, tmp_path, capsys):
    out = tmp_path / "figures"
    assert main(["figures", "--runs", str(tree), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert_written([Path(line) for line in printed.out.splitlines()], ALL)
    assert {p.parent for p in map(Path, printed.out.splitlines())} == {out}
    assert "skipped" not in printed.err


def test_figures_without_data_are_skipped_by_name(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root, "demo", "tiny", "atr", {"name": "atr", "delta": 0.07}, 0, evals_of({0: (0.1,) * 3}), 20)
    out = tmp_path / "figures"
    assert main(["figures", "--runs", str(root), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipped figure 2, clipping and parts curves: no runs of experiment 'table2'" in err
    assert "skipped figure3_delta" in err and "skipped figure4" in err
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "figure1_kl3_bounds.pdf",
        "figure1_kl3_bounds.png",
    ]


def test_figures_of_a_study_take_its_runs_as_the_tables_do(tmp_path, capsys):
    """--study chose the runs: figure 2 and the curves draw them whatever their experiment, as table2 does."""
    root = tmp_path / "runs"
    for method in ("atr", "clip"):
        run = make_run(root, "demo", "tiny", method, {"name": method}, 0, evals_of({0: (0.1,) * 3, 20: (0.2,) * 3}), 20)
        add_parts(run, 0.5)
    out = tmp_path / "figures"
    assert main(["figures", "--runs", str(root), "--study", "demo", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert_written([Path(line) for line in printed.out.splitlines()], ALL[:4])
    assert "skipped figure 2" not in printed.err and "no runs of experiment 'table2'" not in printed.err


def test_figure_functions_return_what_they_wrote(tree, tmp_path):
    figure = figures.figure2(find_runs(tree, "table2"), tmp_path, methods=["atr"])
    assert_written(figure, ["figure2_training_curves"])
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(p.name for p in figure)


def test_moving_average_is_the_trailing_mean_over_the_window_in_steps():
    steps, values = [1, 2, 3, 5, 10], [1.0, 2.0, 3.0, 5.0, 10.0]
    assert figures.moving_average(values, 3, steps) == [1.0, 1.5, 2.0, 4.0, 10.0]  # (2, 5] then (7, 10]
    assert figures.moving_average(values, 100, steps) == [1.0, 1.5, 2.0, 2.75, 4.2]
    assert figures.moving_average(values, 2) == [1.0, 1.5, 2.5, 4.0, 7.5]  # no steps: the last 2 points


def test_smoothing_window_is_100_steps_for_long_runs_and_shrinks_for_short_ones(tmp_path):
    long = make_run(tmp_path, "table2", "m", "atr", {"name": "atr"}, 0, {}, 1000)
    short = make_run(tmp_path, "table2", "m", "clip", {"name": "clip"}, 0, {}, 40)
    assert figures.smoothing_window(find_runs(long)) == 100
    assert figures.smoothing_window(find_runs(short)) == 4
    (short / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.0}) + "\n")
    assert figures.smoothing_window(find_runs(short)) == 1


def test_the_parts_curves_are_skipped_by_name_when_no_run_has_the_parts(tmp_path, capsys):
    """Runs whose summaries lack the parts and that kept no per-sample files still get Figure 2; the parts figure is
    named as skipped, with the reason, rather than drawn empty."""
    root = tmp_path / "runs"
    for method in ("atr", "clip"):
        make_run(root, "table2", "tiny", method, {"name": method}, 0, evals_of({0: (0.1,) * 3, 50: (0.2,) * 3}), 60)
    out = tmp_path / "figures"
    assert main(["figures", "--runs", str(root), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "skipped parts_curves: no run has the answered rate" in err
    assert (out / "figure2_training_curves.png").exists() and not (out / "parts_curves.png").exists()
