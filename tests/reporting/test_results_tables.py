"""Tables from made-up run directories: "final (best)", the Average's best (the best step's average), the base
row, mean ± std over seeds, the δ and Pass@K tables, the missing-evaluation report, the comparison with the
paper, the error messages and the rule that only this tool's own outputs are ever overwritten."""

from __future__ import annotations

import contextlib
import io
import math
from itertools import combinations

import pytest
from conftest import REPO
from helpers.run_trees import BENCHES, cell, evals_of, make_run, read_csv, write_passk_run
from omegaconf import OmegaConf

from atr_grpo.reporting.analyses import tables
from atr_grpo.reporting.runs import find_runs
from atr_grpo.results import main

UNCERTAINTY = [
    "ci_low",
    "ci_high",
    "diff_vs_clip",
    "diff_ci_low",
    "diff_ci_high",
    "p_seeds_vs_clip",
    "p_min_vs_clip",
    "p_holm_vs_clip",
    "mde_vs_clip",
    "power_vs_clip",
    "p_problems_vs_clip",
]
PAPER = REPO / "results" / "paper"


def write_tree(root):
    atr, clip = {"name": "atr", "delta": 0.07}, {"name": "clip", "eps": 0.2}
    # amc23 is best at step 50, aime24 at step 100: the Average's best is step 50's average
    make_run(
        root,
        "table2",
        "qwen3-1.7b",
        "atr",
        atr,
        0,
        evals_of({0: (0.10, 0.02, 0.03), 50: (0.50, 0.10, 0.20), 100: (0.40, 0.16, 0.18)}),
    )
    make_run(
        root,
        "table2",
        "qwen3-1.7b",
        "clip",
        clip,
        0,
        evals_of({0: (0.20, 0.04, 0.03), 50: (0.30, 0.05, 0.05), 100: (0.35, 0.06, 0.04)}),
    )
    make_run(root, "table2", "qwen3-1.7b", "sapo", {"name": "sapo"}, 0, {})  # crashed before evaluating
    dcpo = evals_of({0: (0.2, 0.0, 0.0), 50: (0.9, 0.3, 0.3), 100: (0.3, 0.03, 0.03)})
    del dcpo[50]["aime25"]  # no Average at step 50: its best is over the complete steps only
    make_run(root, "table2", "qwen3-1.7b", "dcpo", {"name": "dcpo"}, 0, dcpo)
    make_run(root, "table2", "qwen3-8b", "atr", atr, 0, evals_of({0: (0.3, 0.1, 0.1), 50: (0.6, 0.2, 0.2)}))
    for seed, finals in enumerate([(0.40, 0.10, 0.10), (0.44, 0.12, 0.08), (0.42, 0.14, 0.12)]):
        make_run(root, "table3", "qwen3-1.7b", "atr", atr, seed, evals_of({50: (0.3, 0.1, 0.1), 100: finals}))
    for eps, level in ((0.1, 0.30), (0.3, 0.36), (0.5, 0.33)):
        for seed in range(2):
            make_run(
                root,
                "table3",
                "qwen3-1.7b",
                f"clip-eps{eps:g}",
                {"name": "clip", "eps": eps},
                seed,
                evals_of({50: (0.1, 0.1, 0.1), 100: (level + 0.02 * seed, 0.1, 0.1)}),
            )
    make_run(root, "table3", "qwen3-1.7b", "kl1", {"name": "kl1"}, 0, evals_of({50: (0.1,) * 3, 100: (0.2,) * 3}))
    for delta, level in ((0.05, 0.20), (0.07, 0.26), (0.09, 0.22)):
        make_run(
            root,
            "ablate_delta",
            "qwen3-1.7b",
            f"atr-delta{delta:g}",
            {"name": "atr", "delta": delta},
            0,
            evals_of({50: (0.1,) * 3, 100: (level, level, level)}),
        )
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("tree") / "runs")


@pytest.fixture(scope="module")
def built(tree, tmp_path_factory):
    """`all` over the tree, once: (out dir, stderr)."""
    out = tmp_path_factory.mktemp("tables")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["all", "--runs", str(tree), "--out", str(out)]) == 0
    return out, err.getvalue()


def test_table2_csv_has_the_contract_columns_and_final_best_values(built):
    rows = read_csv(built[0] / "table2.csv")
    assert list(rows[0]) == ["model", "method", "benchmark", "metric", "final", "best", *UNCERTAINTY]
    amc = cell(rows, model="qwen3-1.7b", method="atr", benchmark="amc23", metric="mean@8")
    assert (amc["final"], amc["best"]) == ("40.00", "50.00")
    aime = cell(rows, model="qwen3-1.7b", method="atr", benchmark="aime24", metric="mean@8")
    assert (aime["final"], aime["best"]) == ("16.00", "16.00")
    passk = cell(rows, model="qwen3-1.7b", method="atr", benchmark="aime25", metric="pass@8")
    assert (passk["final"], passk["best"]) == ("38.00", "40.00")


def test_table2_average_best_is_the_best_steps_average(built):
    rows = read_csv(built[0] / "table2.csv")
    avg = cell(rows, model="qwen3-1.7b", method="atr", benchmark="average", metric="mean@8")
    assert float(avg["final"]) == round((40 + 16 + 18) / 3, 2)
    assert float(avg["best"]) == round((50 + 10 + 20) / 3, 2)  # step 50's average ...
    assert float(avg["best"]) < round((50 + 16 + 20) / 3, 2)  # ... not the mean of per-benchmark bests
    # dcpo has no aime25 at step 50, so no Average there: its best Average is over steps 0 and 100 (0 excluded)
    dcpo = cell(rows, model="qwen3-1.7b", method="dcpo", benchmark="average", metric="mean@8")
    assert (dcpo["final"], dcpo["best"]) == ("12.00", "12.00")


def test_table2_base_row_is_the_step_0_evaluation(built):
    rows = read_csv(built[0] / "table2.csv")
    base = cell(rows, model="qwen3-1.7b", method="base", benchmark="amc23", metric="mean@8")
    assert (base["final"], base["best"]) == ("16.67", "16.67")  # mean of atr 10, clip 20, dcpo 20 at step 0
    base_8b = cell(rows, model="qwen3-8b", method="base", benchmark="average", metric="mean@8")
    assert base_8b["final"] == f"{(30 + 10 + 10) / 3:.2f}"


def test_markdown_and_latex_show_the_paper_layout(built):
    md = (built[0] / "table2.md").read_text()
    assert "| model | method | AMC2023 Mean@8 (%) | AMC2023 Pass@8 (%) | AIME2024 Mean@8 (%)" in md
    assert "| qwen3-1.7b | base | 16.67 |" in md  # one value, as the paper's Base Model row
    assert "| qwen3-1.7b | atr | **40.00** (50.00) | **60.00** (70.00) |" in md  # the highest finals: bold
    assert "| qwen3-1.7b | clip | 35.00 (35.00) | 55.00 (55.00) |" in md
    tex = (built[0] / "table2.tex").read_text()
    assert r"\multicolumn{2}{c}{AMC2023}" in tex and r"\textit{qwen3-1.7b}" in tex
    assert r"atr & \textbf{40.00} (50.00) & " in tex and r"clip & 35.00 (35.00) & " in tex


def test_missing_evaluations_are_reported_in_the_output_and_on_stderr(built):
    md = (built[0] / "table2.md").read_text()
    section = md.split("## Missing evaluations and set-aside runs", 1)[1]
    assert "sapo__s0__model=qwen3-1.7b: no evaluation (eval/summary.jsonl missing or empty)" in section
    assert "dcpo__s0__model=qwen3-1.7b: step 50: no aime25" in section
    assert "atr__s0__model=qwen3-8b: no evaluation at step 100 (1 step) of trainer.max_steps = 100" in section
    stderr = built[1]
    assert "warning: table2:" in stderr and "sapo__s0__model=qwen3-1.7b: no evaluation" in stderr
    assert (
        "runs/table2/table2__atr__s0__model=qwen3-1.7b: no per-sample file eval/step_000100/amc23.jsonl(.gz): "
        "no interval or test" in section
    )  # summaries only: no interval, and the output says why
    rows = read_csv(built[0] / "table2.csv")  # the incomplete 8B run still has its row
    assert cell(rows, model="qwen3-8b", method="atr", benchmark="amc23", metric="mean@8")["final"] == "60.00"


def test_a_run_that_stopped_before_the_other_seeds_of_its_method_is_reported(tmp_path, capsys):
    """With no evaluation schedule to check against (eval.every_steps unset), the other seeds of the method say
    where it should have reached."""
    root = tmp_path / "runs"
    for seed, evals in ((0, {50: (0.1,) * 3, 100: (0.2,) * 3}), (1, {50: (0.1,) * 3})):
        path = make_run(root, "table2", "m", "atr", {"name": "atr"}, seed, evals_of(evals))
        config = OmegaConf.load(path / "config.yaml")
        config.eval.every_steps = None
        OmegaConf.save(config, path / "config.yaml")
    assert main(["table2", "--runs", str(root), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "atr__s1__model=m: last evaluation at step 50, other runs of atr in study table2 reach step 100" in err
    assert "atr__s0__model=m: last evaluation" not in err


def test_a_longer_variant_leaves_the_complete_runs_of_other_settings_complete(tmp_path, capsys):
    """Runs of 4 steps evaluated as scheduled are complete, though a variant of 6 steps joins the study."""
    root = tmp_path / "runs"
    for method in ("atr", "clip"):
        make_run(root, "table2", "m", method, {"name": method}, 0, evals_of({0: (0.1,) * 3, 4: (0.2,) * 3}), 4)
    make_run(
        root, "table2", "m", "atr", {"name": "atr"}, 0, evals_of({0: (0.1,) * 3, 6: (0.3,) * 3}), 6, name="atr-long"
    )
    out = tmp_path / "out"
    assert main(["table2", "--runs", str(root), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "last evaluation" not in err and "reach step" not in err
    section = (out / "table2.md").read_text().split("## Missing evaluations and set-aside runs", 1)[1]
    assert "last evaluation" not in section and "no evaluation at step" not in section


def test_table3_mean_and_sample_std_over_seeds(built):
    rows = read_csv(built[0] / "table3.csv")
    assert list(rows[0]) == ["model", "method", "benchmark", "metric", "mean", "std", "n_seeds", *UNCERTAINTY]
    amc = cell(rows, method="atr", benchmark="amc23", metric="mean@8")
    std = math.sqrt(((40 - 42) ** 2 + (44 - 42) ** 2 + 0) / 2)  # ddof = 1, the results' one convention
    assert (amc["mean"], amc["std"], amc["n_seeds"]) == ("42.00", f"{std:.2f}", "3")
    avg = cell(rows, method="atr", benchmark="average", metric="mean@8")
    finals = [(40 + 10 + 10) / 3, (44 + 12 + 8) / 3, (42 + 14 + 12) / 3]  # each seed's final Average
    mean = sum(finals) / 3
    assert float(avg["mean"]) == round(mean, 2)
    assert float(avg["std"]) == round(math.sqrt(sum((f - mean) ** 2 for f in finals) / 2), 2)
    md = (built[0] / "table3.md").read_text()
    assert f"| qwen3-1.7b | atr | **42.00** ± {std:.2f} |" in md


def test_table3_population_std_on_request_and_nan_for_one_seed(tree, tmp_path):
    """--ddof 0 gives the paper's population std, sqrt(8 / 3); one seed has no std either way."""
    assert main(["table3", "--runs", str(tree), "--out", str(tmp_path), "--ddof", "0"]) == 0
    rows = read_csv(tmp_path / "table3.csv")
    assert cell(rows, method="atr", benchmark="amc23", metric="mean@8")["std"] == "1.63"  # sqrt(8 / 3)
    single = cell(rows, method="kl1", benchmark="amc23", metric="mean@8")
    assert (single["mean"], single["std"], single["n_seeds"]) == ("20.00", "nan", "1")
    assert "| qwen3-1.7b | kl1 | 20.00 ± – |" in (tmp_path / "table3.md").read_text()
    assert r"20.00 $\pm$ --" in (tmp_path / "table3.tex").read_text()


def test_table3_clip_tuned_is_the_best_eps(built):
    rows = read_csv(built[0] / "table3.csv")
    tuned = cell(rows, method="clip-tuned", benchmark="amc23", metric="mean@8")
    assert (tuned["mean"], tuned["n_seeds"]) == ("37.00", "2")  # ε = 0.3: (36 + 38) / 2, best of 0.1, 0.3, 0.5
    assert "clip-tuned = clip with ε = 0.3" in (built[0] / "table3.md").read_text()


def test_delta_table(built):
    rows = read_csv(built[0] / "delta.csv")
    assert list(rows[0]) == ["model", "delta", "mean@8", "pass@8", "n_seeds"]
    assert [(r["delta"], r["mean@8"], r["pass@8"]) for r in rows] == [
        ("0.05", "20.00", "40.00"),
        ("0.07", "26.00", "46.00"),
        ("0.09", "22.00", "42.00"),
    ]


def test_a_run_set_with_one_delta_draws_no_delta_sweep(tmp_path, capsys):
    """One δ is no sweep: `all` skips the delta table with a note, and `figures` skips Figure 3."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        evals = evals_of({50: (0.1,) * 3, 100: (0.2,) * 3})
        make_run(root, "ablate_delta", "qwen3-1.7b", "atr", {"name": "atr", "delta": 0.07}, seed, evals)
    assert main(["all", "--runs", str(root), "--out", str(tmp_path / "tables"), "--resamples", "200"]) == 0
    err = capsys.readouterr().err
    assert "skipped delta: one δ per model (qwen3-1.7b δ 0.07): a δ sweep needs several" in err
    assert not (tmp_path / "tables" / "delta.csv").exists()
    assert main(["figures", "--runs", str(root), "--out", str(tmp_path / "figures")]) == 0
    assert "skipped figure3_delta: one δ per model" in capsys.readouterr().err
    assert not (tmp_path / "figures" / "figure3_delta.png").exists()


def test_comparison_with_the_paper(built):
    vs = (built[0] / "table2_vs_paper.md").read_text()
    assert "| model | method | benchmark | metric | ours final | paper final | Δ final | ours best |" in vs
    assert "| qwen3-1.7b | atr | amc23 | mean@8 | 40.00 | 41.72 | -1.72 | 50.00 | 45.03 | +4.97 |" in vs
    assert "| qwen3-1.7b | base | amc23 | mean@8 | 16.67 | 28.61 | -11.94 |" in vs
    vs3 = (built[0] / "table3_vs_paper.md").read_text()
    assert "| qwen3-1.7b | atr | amc23 | mean@8 | 42.00 | 43.17 | -1.17 | 2.00 | 1.17 | +0.83 |" in vs3
    assert "The paper's std is the population one (ddof 0)" in vs3
    assert not (built[0] / "delta_vs_paper.md").exists()  # the paper states no Figure 3 numbers


def test_passk_curve_matches_brute_force(tmp_path):
    """Pass@K from n samples is the fraction of K-subsets with a correct sample (exhaustive check, n = 6)."""
    correct = {
        "amc23": [[1, 0, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0]],
        "aime24": [[0] * 6, [0, 0, 0, 0, 0, 1]],
        "aime25": [[1] * 6, [0, 1, 0, 0, 0, 0]],
    }
    write_passk_run(tmp_path / "runs", correct)
    table = tables.passk_table(find_runs(tmp_path / "runs", "passk_curve"))

    def brute(row, k):
        return sum(any(row[i] for i in subset) for subset in combinations(range(6), k)) / math.comb(6, k)

    for k in range(1, 7):
        got = next(r for r in table.rows if r["benchmark"] == "average" and r["k"] == k)
        assert got["pass@k"] == round(100 * sum(brute(row, k) for m in correct.values() for row in m) / 6, 2)
        assert got["mean@k"] == round(100 * sum(sum(row[:k]) / k for m in correct.values() for row in m) / 6, 2)


def test_passk_cli_writes_every_k_and_compares_with_the_paper(tmp_path):
    write_passk_run(tmp_path / "runs", {b: [[1, 0, 0, 0, 0, 0]] for b in BENCHES})
    out = tmp_path / "out"
    assert main(["passk", "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    rows = read_csv(out / "passk.csv")
    assert len(rows) == 6 * 4 and {r["benchmark"] for r in rows} == {*BENCHES, "average"}
    k1 = cell(rows, benchmark="average", k="1")
    assert (k1["mean@k"], k1["pass@k"]) == ("100.00", "16.67")
    vs = (out / "passk_vs_paper.md").read_text()
    assert "| qwen3-1.7b | atr | average | 1 | 100.00 | nan | – | 16.67 | 24.36 | -7.69 |" in vs


ALLOWED = (
    "table2, table3, seeds, seeds_auc, delta, passk, clip_binding, endpoints, parts, bounds, timing, all, figures, "
    "compare, regrade, pack, diverge"
)


def test_unknown_table_lists_the_allowed_ones(tree, capsys):
    with pytest.raises(SystemExit):
        main(["table9", "--runs", str(tree)])
    assert f"unknown subcommand 'table9'; did you mean 'table3'? allowed: {ALLOWED}" in capsys.readouterr().err


def test_a_misspelled_subcommand_is_named_unknown_and_guessed_before_its_arguments_are_read(capsys):
    """`comapre atr clip`: the subcommand is unknown (not "unrecognized arguments: atr clip"), with a guess."""
    with pytest.raises(SystemExit) as exit_info:
        main(["comapre", "atr", "clip"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert f"error: unknown subcommand 'comapre'; did you mean 'compare'? allowed: {ALLOWED}" in err
    assert "unrecognized arguments" not in err
    with pytest.raises(SystemExit):
        main(["xyzzy"])
    assert f"error: unknown subcommand 'xyzzy'; allowed: {ALLOWED}" in capsys.readouterr().err


def test_no_runs_fails_clearly(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["table2", "--runs", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert "no run directories (folders with a config.yaml) under" in capsys.readouterr().err
    assert main(["all", "--runs", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert (
        "none of table2, table3, seeds, seeds_auc, delta, passk, clip_binding, endpoints, parts, bounds, timing "
        "has runs" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["table2", "--runs", str(tmp_path / "absent")])
    assert "is not a directory" in capsys.readouterr().err


def test_without_runs_the_studys_own_folder_is_read_and_said(tmp_path, monkeypatch, capsys):
    """--runs left at results/runs, which is absent: --study NAME reads results/NAME/runs and says so; with no
    such folder the error lists the run folders there are."""
    from helpers.run_trees import make_run

    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "results" / "power3" / "runs", "power3", "tiny", "clip", {"name": "clip"}, 10, {})
    assert main(["timing", "--study", "power3", "--out", str(tmp_path / "out")]) == 0
    assert "reading results/power3/runs: the runs of power3 (--runs results/runs is absent)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["timing", "--study", "power4"])
    err = capsys.readouterr().err
    assert "--runs results/runs is not a directory; run folders here: results/power3/runs" in err


def test_absent_experiment_names_the_ones_found(tree, tmp_path, capsys):
    assert main(["passk", "--runs", str(tree), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        "no runs of experiment 'passk_curve'" in err
        and "found: ablate_delta (3 runs), table2 (5 runs), table3 (10 runs)" in err
    )


def test_experiment_option_tabulates_another_experiment(tree, tmp_path):
    assert main(["table2", "--runs", str(tree), "--out", str(tmp_path), "--experiment", "ablate_delta"]) == 0
    rows = read_csv(tmp_path / "table2.csv")
    assert cell(rows, method="atr-delta0.07", benchmark="average", metric="mean@8")["final"] == "26.00"


def test_all_builds_the_tables_that_have_runs_and_names_the_others(built):
    out, stderr = built
    assert {p.name for p in out.iterdir()} >= {"table2.csv", "table3.md", "delta.tex", "table2_vs_paper.md"}
    assert not (out / "passk.csv").exists()
    assert "skipped passk: no runs of experiment 'passk_curve'" in stderr


def test_user_files_in_out_are_never_overwritten(tree, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "table2.md").write_text("my notes")
    assert main(["table2", "--runs", str(tree), "--out", str(out)]) == 2
    assert "refusing to overwrite table2.md" in capsys.readouterr().err
    assert (out / "table2.md").read_text() == "my notes" and not (out / "table2.csv").exists()
    run_dir = next((tree / "table2").iterdir())
    assert main(["table2", "--runs", str(tree), "--out", str(run_dir / "tables")]) == 2
    assert "is inside the run directory" in capsys.readouterr().err


def test_own_outputs_are_rewritten_and_stale_ones_removed(tree, tmp_path):
    out = tmp_path / "out"
    assert main(["table2", "--runs", str(tree), "--out", str(out)]) == 0
    assert main(["table2", "--runs", str(tree), "--out", str(out)]) == 0  # its own files: overwritten
    (out / "notes.txt").write_text("mine")
    assert main(["all", "--runs", str(tree), "--out", str(out), "--experiment", "nothing"]) == 2
    assert not (out / "table2.csv").exists() and (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("column", ["final", "best"])
def test_transcribed_table2_averages_are_consistent(column):
    """The paper's final Average is the mean of its three benchmarks (to rounding); its best Average, the best
    step's, can not exceed the mean of the per-benchmark bests. A mistyped cell breaks one of the two."""
    values: dict[tuple, dict[str, float]] = {}
    for r in read_csv(PAPER / "table2.csv"):
        values.setdefault((r["model"], r["method"], r["metric"]), {})[r["benchmark"]] = float(r[column])
    assert len(values) == 2 * 8 * 2
    for key, v in values.items():
        mean = sum(v[b] for b in BENCHES) / 3
        if column == "final":
            assert abs(mean - v["average"]) <= 0.011, key
        else:
            assert v["average"] <= mean + 0.011, key


def test_transcribed_table3_is_complete_and_consistent():
    rows = read_csv(PAPER / "table3.csv")
    assert len(rows) == 12 * 4 * 2 and {r["n_seeds"] for r in rows} == {"3"}
    values: dict[tuple, dict[str, float]] = {}
    for r in rows:
        values.setdefault((r["method"], r["metric"]), {})[r["benchmark"]] = float(r["mean"])
    for key, v in values.items():
        assert abs(sum(v[b] for b in BENCHES) / 3 - v["average"]) <= 0.011, key


def test_a_failed_evaluation_is_listed_until_a_later_attempt_completes_it(tmp_path, capsys):
    """eval/failures.jsonl: a step whose last attempt failed is named, with its error, in the output and on stderr."""
    from atr_grpo.evaluation.schedule import record_failure

    clip = {"name": "clip", "eps": 0.2}
    path = make_run(tmp_path, "table2", "qwen3-1.7b", "clip", clip, 0, evals_of({0: (0.2, 0.1, 0.1)}), max_steps=50)
    record_failure(path, 50, "after", MemoryError("CUDA out of memory"))
    record_failure(path, 0, "during", RuntimeError("engine died"))  # step 0 was evaluated later: not listed
    (run,) = find_runs(tmp_path)
    failed = [p for p in run.problems if "failed" in p]
    assert failed == [
        "evaluation at step 50 failed: MemoryError: CUDA out of memory (traceback in eval/failures.jsonl)"
    ]
    assert main(["table2", "--runs", str(tmp_path), "--out", str(tmp_path / "out"), "--resamples", "100"]) == 0
    assert "evaluation at step 50 failed: MemoryError" in capsys.readouterr().err
