"""Intervals in tables 2 and 3, the seeds table and `compare A B`, on run trees with per-sample files whose
differences are known exactly: the interval is around the reported value with the width of the problems' spread,
the paired difference and its per-seed values are exact, a gain in every seed pair gets the smallest p that
number of seeds allows (1 with one seed, 0.25 with 3: never marked; 2/1024 with 10: marked), identical methods
get p = 1 and no mark, `compare` and the tables print the same numbers for the same comparison, pairing refuses
what does not match (naming it), compressed per-sample files read alike, and a rebuild is byte-identical."""

from __future__ import annotations

import contextlib
import io
import math
import shutil

import pytest
from helpers.run_trees import BENCHES, cell, read_csv
from helpers.sampled_runs import PROBLEMS, SAMPLES, counts_matrix, method_matrices, sampled_run, write_sample_file

from atr_grpo.results import main

RESAMPLES = 2000


def build_tree(root, compress=False):
    for seed in range(3):
        sampled_run(root, "table3", "clip", seed, method_matrices(0, seed), compress=compress)
        sampled_run(root, "table3", "atr", seed, method_matrices(2, seed), compress=compress)  # +2 correct each
        sampled_run(root, "table3", "kl1", seed, method_matrices(0, seed), compress=compress)  # same as clip
    sampled_run(root, "table2", "clip", 0, method_matrices(0, 0), compress=compress)
    sampled_run(root, "table2", "atr", 0, method_matrices(2, 0), compress=compress)
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_tree(tmp_path_factory.mktemp("sampled") / "runs")


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def built(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("tables")
    for name in ("table2", "table3"):
        assert run_cli(name, "--runs", tree, "--out", out, "--resamples", RESAMPLES)[0] == 0
    return out


def test_table2_interval_is_around_the_final_value_with_the_width_of_the_problems_spread(built):
    """One seed: the percentile interval of a mean of P per-problem scores ≈ mean ± 1.96 σ̂ / √P."""
    row = cell(read_csv(built / "table2.csv"), method="clip", benchmark="amc23", metric="mean@8")
    scores = [(i % 5) / SAMPLES for i in range(PROBLEMS)]
    mean = sum(scores) / PROBLEMS
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / PROBLEMS)
    assert float(row["final"]) == 100 * mean == 25.0
    low, high = float(row["ci_low"]), float(row["ci_high"])
    assert low < 25.0 < high
    assert (high - low) == pytest.approx(100 * 2 * 1.96 * sd / math.sqrt(PROBLEMS), rel=0.12)


def test_table2_with_one_seed_never_marks_a_gain(built):
    """atr has 2 more correct samples of 8 on every problem: +25 points. With one seed per method the run is
    the unit, so there is one difference: no t-interval, p = 1 (its 2 sign patterns are equally extreme), no †.
    The problem-level test, about these two runs, is at its floor 1 / (R + 1)."""
    rows = read_csv(built / "table2.csv")
    atr = cell(rows, method="atr", benchmark="aime24", metric="mean@8")
    assert (atr["diff_vs_clip"], atr["diff_ci_low"], atr["diff_ci_high"], atr["mde_vs_clip"]) == (
        "25.00",
        "nan",
        "nan",
        "nan",
    )
    assert (atr["p_seeds_vs_clip"], atr["p_min_vs_clip"], atr["p_holm_vs_clip"]) == ("1", "1", "1")
    assert float(atr["p_problems_vs_clip"]) == pytest.approx(1 / (RESAMPLES + 1), rel=1e-3)
    assert cell(rows, method="clip", benchmark="aime24", metric="mean@8")["p_seeds_vs_clip"] == "nan"  # baseline
    md = (built / "table2.md").read_text()
    assert "| qwen3-1.7b | atr | **50.00** (50.00) [" in md and "†" not in md.split("_† =")[0]
    assert "with 1 seed (all 2^S sign patterns) the smallest attainable p is 1, so no difference can be marked" in md
    assert f"{RESAMPLES:,} resamples, seed 0" in md and r"50.00} (50.00) [" in (built / "table2.tex").read_text()


def test_table3_with_three_seeds_gives_the_floor_and_no_mark(built):
    """The same gain in all 3 seed pairs: p = 2/8 = 0.25, the smallest 3 seeds allow; Holm over the family
    {atr, kl1} doubles it; no spread, so no t-interval (not the point +25); identical methods get p = 1."""
    rows = read_csv(built / "table3.csv")
    clip = cell(rows, method="clip", benchmark="average", metric="mean@8")
    assert (clip["mean"], clip["n_seeds"]) == ("25.00", "3")
    assert float(clip["ci_low"]) < 25.0 < float(clip["ci_high"])
    same = cell(rows, method="kl1", benchmark="amc23", metric="pass@8")
    assert (same["diff_vs_clip"], same["p_seeds_vs_clip"], same["p_holm_vs_clip"]) == ("0.00", "1", "1")
    atr = cell(rows, method="atr", benchmark="amc23", metric="mean@8")
    assert (
        atr["diff_ci_low"],
        atr["diff_ci_high"],
        atr["p_seeds_vs_clip"],
        atr["p_min_vs_clip"],
        atr["p_holm_vs_clip"],
    ) == ("nan", "nan", "0.25", "0.25", "0.5")
    md = (built / "table3.md").read_text()
    assert "| qwen3-1.7b | kl1 | 25.00 ± 0.00 [" in md and "| qwen3-1.7b | atr | **50.00** ± 0.00 [" in md
    assert (
        "with 3 seeds (all 2^S sign patterns) the smallest attainable p is 0.25, so no difference can be marked" in md
    )


def ten_seed_tree(root):
    """10 seeds: atr gains 1 correct sample of 8 per problem in odd seeds, 2 in even ones (+12.5 / +25 points)."""
    for seed in range(10):
        sampled_run(root, "table3", "clip", seed, method_matrices(0, seed))
        sampled_run(root, "table3", "atr", seed, method_matrices(2 - seed % 2, seed))
        sampled_run(root, "table3", "kl1", seed, method_matrices(0, seed))
    return root


@pytest.fixture(scope="module")
def ten_seeds(tmp_path_factory):
    root = ten_seed_tree(tmp_path_factory.mktemp("ten") / "runs")
    out = tmp_path_factory.mktemp("ten_tables")
    for name in ("table3", "seeds"):
        assert run_cli(name, "--runs", root, "--out", out, "--resamples", RESAMPLES)[0] == 0
    return root, out


def test_ten_seeds_that_all_favour_a_method_are_marked(ten_seeds):
    """All 10 seed pairs favour atr: p = 2/1024, Holm over {atr, kl1} 4/1024 < 0.05: †. The t-interval is the
    mean ± t_.975 · SD / √10 of the per-seed differences; the MDE is at the level of Holm's first step in a family
    of 2, α/2: (t_{1−0.0125} + t_.8) · SD / √10; a marked difference has no observed-power cell."""
    _, out = ten_seeds
    atr = cell(read_csv(out / "table3.csv"), method="atr", benchmark="aime24", metric="mean@8")
    differences = [25.0 - 12.5 * (seed % 2) for seed in range(10)]
    mean, sd = sum(differences) / 10, math.sqrt(sum((d - 18.75) ** 2 for d in differences) / 9)
    assert float(atr["diff_vs_clip"]) == mean == 18.75
    assert float(atr["diff_ci_high"]) - mean == pytest.approx(2.262157 * sd / math.sqrt(10), abs=0.006)
    assert atr["mde_vs_clip"] == f"{(2.685011 + 0.883404) * sd / math.sqrt(10):.2f}"
    assert atr["power_vs_clip"] == "nan"
    assert float(atr["p_seeds_vs_clip"]) == float(atr["p_min_vs_clip"]) == pytest.approx(2 / 1024, rel=1e-3)
    assert float(atr["p_holm_vs_clip"]) == pytest.approx(4 / 1024, rel=1e-3)
    assert "| qwen3-1.7b | atr | **43.75**† ± " in (out / "table3.md").read_text()
    seeds = cell(read_csv(out / "seeds.csv"), method="atr", benchmark="aime24", metric="mean@8")
    assert seeds["diff_per_seed"] == " ".join(f"{d:+.2f}" for d in differences) and seeds["n_seeds"] == "10"
    assert (seeds["p_improve"], seeds["iqm"]) == ("1.00", "43.75")  # every atr run beats every clip run


def _rows_of(text, first_cells):
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| " + " | ".join(first_cells) + " |")
    ]


@pytest.mark.parametrize("endpoint", ["final", "auc"])
@pytest.mark.parametrize("tree_of", ["three", "ten"])
def test_compare_and_the_seeds_table_print_the_same_numbers(tree_of, endpoint, tree, ten_seeds, tmp_path):
    """One Holm family and one random stream per comparison: every cell `compare atr clip` prints (difference,
    per seed, t-interval, p, smallest p, Holm p, †, paired t, MDE, IQM, P(A > B) and its interval, the
    problem-level p) is the seeds table's cell for atr (seeds_auc's with --endpoint auc), and table3's CSV has
    the same p and Holm p."""
    root = tree if tree_of == "three" else ten_seeds[0]
    out, table_name = tmp_path / "tables", "seeds" if endpoint == "final" else "seeds_auc"
    assert run_cli(table_name, "--runs", root, "--out", out, "--resamples", RESAMPLES)[0] == 0
    assert run_cli("table3", "--runs", root, "--out", out, "--resamples", RESAMPLES)[0] == 0
    code, printed, _ = run_cli(
        "compare",
        "atr",
        "clip",
        "--runs",
        root,
        "--experiment",
        "table3",
        "--resamples",
        RESAMPLES,
        "--endpoint",
        endpoint,
    )
    assert code == 0
    table = (out / f"{table_name}.md").read_text()
    for bench in (*BENCHES, "average"):
        for metric in ("mean@8", "pass@8"):
            seed_level, robust = _rows_of(printed, [bench, metric])
            (row,) = _rows_of(table, ["qwen3-1.7b", "atr", bench, metric])
            assert row[7:17] == seed_level[4:14]  # from the difference to the MDE and the power
            assert row[17:20] == robust[4:7] and row[6] == robust[2]  # P(A > B), its interval, p (problems); IQM
            assert seed_level[10] == ("†" if tree_of == "ten" else "")
            if endpoint == "final":
                csv_row = cell(read_csv(out / "table3.csv"), method="atr", benchmark=bench, metric=metric)
                assert f"{float(csv_row['p_holm_vs_clip']):.3g}" == f"{float(seed_level[9]):.3g}"


def test_the_auc_comparison_averages_each_run_over_its_evaluations_after_step_0(tree, tmp_path):
    """The tree evaluates at steps 50 and 100: each problem's AUC score is the mean of its two scores, so each
    run's AUC is the mean of its two Mean@8 values, the `auc` of the endpoints table."""
    code, printed, err = run_cli(
        "compare",
        "atr",
        "clip",
        "--runs",
        tree,
        "--experiment",
        "table3",
        "--resamples",
        RESAMPLES,
        "--endpoint",
        "auc",
        "--benchmark",
        "amc23",
        "--metric",
        "mean@8",
    )
    assert code == 0, err

    def auc(extra, seed):
        final = [min((i + seed) % 5 + extra, SAMPLES) for i in range(PROBLEMS)]
        early = [max(c - 1, 0) for c in final]
        return 100 * (sum(final) + sum(early)) / (2 * PROBLEMS * SAMPLES)

    per_seed = [auc(2, seed) - auc(0, seed) for seed in range(3)]
    atr, clip = (sum(auc(extra, seed) for seed in range(3)) / 3 for extra in (2, 0))
    assert "(seeds 0, 1, 2; AUC: each run’s mean over its evaluation steps 50, 100)" in printed
    assert f"| amc23 | mean@8 | {atr:.2f} | {clip:.2f} | {atr - clip:+.2f} | " in printed
    assert " | " + ", ".join(f"{d:+.2f}" for d in per_seed) + " | " in printed
    assert per_seed[0] != 25.0  # the final-step difference: the AUC is not the final value
    assert run_cli("endpoints", "--runs", tree, "--out", tmp_path, "--experiment", "table3")[0] == 0
    row = cell(read_csv(tmp_path / "endpoints.csv"), method="atr", benchmark="amc23", metric="mean@8")
    assert float(row["auc"]) == pytest.approx(atr, abs=1e-9)


def test_compare_refuses_a_bad_endpoint(tree, capsys):
    code, _, err = run_cli("compare", "atr", "clip", "--runs", tree, "--endpoint", "auc", "--step", 50)
    assert code == 2 and "--step 50 reads one evaluation; it cannot be combined with --endpoint auc" in err
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "atr", "clip", "--runs", str(tree), "--endpoint", "best"])
    assert (
        exit_.value.code == 2
        and "argument --endpoint: invalid choice: 'best' (choose from 'final', 'auc')" in capsys.readouterr().err
    )


def test_rebuilding_the_tables_is_byte_identical(tree, built, tmp_path):
    assert run_cli("table3", "--runs", tree, "--out", tmp_path, "--resamples", RESAMPLES)[0] == 0
    for ext in ("csv", "md", "tex"):
        assert (tmp_path / f"table3.{ext}").read_bytes() == (built / f"table3.{ext}").read_bytes()


def test_another_bootstrap_seed_moves_the_interval_only_slightly(tree, built, tmp_path):
    assert run_cli("table3", "--runs", tree, "--out", tmp_path, "--resamples", RESAMPLES, "--bootstrap-seed", 1)[0] == 0
    before = cell(read_csv(built / "table3.csv"), method="clip", benchmark="amc23", metric="mean@8")
    after = cell(read_csv(tmp_path / "table3.csv"), method="clip", benchmark="amc23", metric="mean@8")
    assert before["ci_low"] != after["ci_low"]
    assert float(after["ci_low"]) == pytest.approx(float(before["ci_low"]), abs=1.0)


def test_compare_prints_the_seed_level_difference_per_benchmark_and_seed(tree):
    code, out, err = run_cli(
        "compare",
        "atr",
        "clip",
        "--runs",
        tree,
        "--experiment",
        "table3",
        "--resamples",
        RESAMPLES,
        "--metric",
        "mean@8",
    )
    assert code == 0, err
    assert "## atr − clip: table3, qwen3-1.7b (seeds 0, 1, 2; evaluation steps 100)" in out
    # the same gain in the 3 seed pairs: p = 0.25 = the floor; Holm over the family {atr, kl1}: 0.5; no spread,
    # so no t-interval, no paired t-test and no MDE
    assert (
        "| amc23 | mean@8 | 50.00 | 25.00 | +25.00 | +25.00, +25.00, +25.00 | – | 0.25 | 0.25 | 0.5 |  | – | – | – |"
        in out
    )
    assert f"| amc23 | mean@8 | 50.00 | 25.00 | 1.00 | [1.00, 1.00] | < {1 / RESAMPLES:.0e}".replace("e-0", "e-") in out
    assert "| average | mean@8 | 50.00 | 25.00 | +25.00 |" in out and "| 90 |" in out  # 3 benchmarks × 30 problems
    assert "Holm family: 2 method(s) compared with clip in each benchmark × metric column: atr, kl1." in out
    assert (
        "with 3 seeds (all 2^S sign patterns) the smallest attainable p is 0.25, so no difference can be marked" in out
    )


def test_compare_of_identical_methods_finds_nothing(tree):
    code, out, _ = run_cli(
        "compare",
        "kl1",
        "clip",
        "--runs",
        tree,
        "--resamples",
        RESAMPLES,
        "--benchmark",
        "aime25",
        "--metric",
        "pass@8",
    )
    assert code == 0
    # the same samples: no seed-level p either (p (seeds), p (Holm), p (paired t)); the smallest p stays
    assert "| aime25 | pass@8 | 80.00 | 80.00 | +0.00 | +0.00, +0.00, +0.00 | – | – | 0.25 | – |  | – | – | – |" in out
    assert "| aime25 | pass@8 | 80.00 | 80.00 | – | – | – | 30 |" in out  # the same samples: no P(A > B), no p


def test_compare_at_an_earlier_step(tree):
    code, out, _ = run_cli(
        "compare",
        "atr",
        "clip",
        "--runs",
        tree,
        "--experiment",
        "table2",
        "--step",
        50,
        "--benchmark",
        "amc23",
        "--metric",
        "mean@8",
        "--resamples",
        RESAMPLES,
    )
    assert code == 0 and "(seeds 0; evaluation steps 50)" in out
    # step 50 has one correct sample fewer per problem, floored at 0: atr 1..5 of 8, clip 0, 0..3
    clip = sum(max(i % 5 - 1, 0) for i in range(PROBLEMS)) / (PROBLEMS * SAMPLES)
    assert f"| amc23 | mean@8 | 37.50 | {100 * clip:.2f} | {100 * (0.375 - clip):+.2f} |" in out


def test_compressed_per_sample_files_give_the_same_comparison(tree, tmp_path):
    packed = build_tree(tmp_path / "runs", compress=True)
    assert not list(packed.rglob("*.jsonl")) or all(
        p.name in ("summary.jsonl", "metrics.jsonl") for p in packed.rglob("*.jsonl")
    )
    argv = ("compare", "atr", "clip", "--experiment", "table3", "--resamples", RESAMPLES)
    assert run_cli(*argv, "--runs", packed)[1] == run_cli(*argv, "--runs", tree)[1]


@pytest.fixture()
def mismatched(tmp_path):
    root = tmp_path / "runs"
    for seed in range(2):
        sampled_run(root, "pairs", "clip", seed, method_matrices(0, seed))
    sampled_run(root, "pairs", "atr", 0, method_matrices(1, 0))
    fewer = counts_matrix([1] * (PROBLEMS - 1))  # problem 29 missing on aime24 at the final step
    for method, seeds_short in (("sapo", [1]), ("kl2", [0, 1])):  # within one method / in both of its seeds
        for seed in range(2):
            path = sampled_run(root, "pairs", method, seed, method_matrices(1, seed))
            if seed in seeds_short:
                write_sample_file(path / "eval" / "step_000100" / "aime24.jsonl", fewer)
    return root


def test_compare_pairs_the_common_seeds_and_names_those_left_out(mismatched):
    """atr has seed 0, clip seeds 0 and 1: one pair, whose smallest p (1) can mark nothing."""
    code, out, err = run_cli("compare", "atr", "clip", "--runs", mismatched, "--resamples", 200, "--metric", "mean@8")
    assert code == 0, err
    assert "## atr − clip: pairs, qwen3-1.7b (seeds 0; evaluation steps 100)" in out
    assert "| amc23 | mean@8 | 37.50 | 25.00 | +12.50 | +12.50 | – | 1 | 1 | 1 |  | – | – | – |" in out
    assert (
        "Paired on the seeds both methods have (0); left out: clip seed 1. The tables give this pair no test: they "
        "pair only methods with the same seeds." in out
    )
    assert "with 1 seed (all 2^S sign patterns) the smallest attainable p is 1, so no difference can be marked" in out


def test_compare_refuses_methods_with_no_common_seed(tmp_path):
    root = tmp_path / "runs"
    sampled_run(root, "pairs", "clip", 0, method_matrices(0, 0))
    sampled_run(root, "pairs", "atr", 1, method_matrices(1, 1))
    code, _, err = run_cli("compare", "atr", "clip", "--runs", root, "--resamples", 200)
    assert code == 2
    assert "pairs/qwen3-1.7b: pairing needs a seed both methods have: atr has [1], clip has [0]" in err


def test_compare_refuses_unpaired_problems_naming_them(mismatched):
    code, _, err = run_cli("compare", "sapo", "clip", "--runs", mismatched, "--resamples", 200, "--benchmark", "aime24")
    assert code == 2
    assert "pairs__sapo__s1__model=qwen3-1.7b: aime24 problems differ from" in err and "(missing here: 29;" in err
    code, _, err = run_cli("compare", "kl2", "clip", "--runs", mismatched, "--resamples", 200, "--benchmark", "aime24")
    assert code == 2 and "pairing needs the same problems: on aime24, clip lacks – and kl2 lacks 29" in err


def test_compare_names_what_exists_when_the_request_is_wrong(mismatched):
    code, _, err = run_cli("compare", "atr", "dcpo", "--runs", mismatched)
    assert code == 2 and "METHOD 'dcpo': no such method; methods: atr, clip, kl2, sapo" in err
    code, _, err = run_cli("compare", "atr", "clip", "--runs", mismatched, "--metric", "mean8")
    assert code == 2 and "--metric 'mean8': expected mean@K, pass@K" in err
    code, _, err = run_cli("compare", "atr", "clip", "--runs", mismatched, "--benchmark", "gsm8k")
    assert code == 2 and "--benchmark gsm8k: pairs/qwen3-1.7b evaluates amc23, aime24, aime25 (and average)" in err
    code, _, err = run_cli("compare", "atr", "clip", "--runs", mismatched, "--metric", "mean@16")
    assert code == 2 and "fewer than 16 samples for mean@16" in err
    with pytest.raises(SystemExit):
        run_cli("compare", "atr", "clip", "--runs", mismatched, "--grader", "nope")


def test_cells_without_per_sample_files_say_so(tmp_path):
    root = build_tree(tmp_path / "runs")
    shutil.rmtree(root / "table2" / "table2__clip__s0__model=qwen3-1.7b" / "eval" / "step_000100")
    code, _, err = run_cli("table2", "--runs", root, "--out", tmp_path / "out", "--resamples", 200)
    assert code == 0
    assert "table2__clip__s0__model=qwen3-1.7b: no per-sample file eval/step_000100/amc23.jsonl(.gz)" in err
    rows = read_csv(tmp_path / "out" / "table2.csv")
    assert cell(rows, method="clip", benchmark="amc23", metric="mean@8")["ci_low"] == "nan"
    assert cell(rows, method="atr", benchmark="amc23", metric="mean@8")["p_seeds_vs_clip"] == "nan"  # no baseline
    assert cell(rows, method="atr", benchmark="amc23", metric="mean@8")["ci_low"] != "nan"
    assert set(BENCHES) <= {r["benchmark"] for r in rows}


def test_compare_gives_the_evaluation_noise_of_a_seeds_difference_from_the_paired_samples(tree):
    """atr has 2 more correct samples than clip on every problem: per problem the 8 paired differences are two 1s
    and six 0s, s² = 1.5 / 7, so a problem's Mean@8 difference varies by s² / 8 over draws; 30 problems give
    SD √(1.5 / 7 / 8 / 30) = 2.99 points on a benchmark, and 2.99 / √3 = 1.73 on the Average of three."""
    out = run_cli("compare", "atr", "clip", "--runs", tree, "--experiment", "table3", "--resamples", RESAMPLES)[1]
    noise = 100 * math.sqrt(1.5 / 7 / 8 / 30)
    assert f"{noise:.2f}" == "2.99" and f"{noise / math.sqrt(3):.2f}" == "1.73"
    assert (
        "amc23 mean@8: evaluation noise of a seed's difference 2.99 points (the draws alone, from the paired "
        "samples' spread), seed SD of the differences 0.00: the noise is – of their variance (reported, not a gate)."
        in out
    )
    assert "average mean@8: evaluation noise of a seed's difference 1.73 points" in out
    assert "pass@8: evaluation noise" not in out  # Pass@K has no such form
    same = run_cli("compare", "kl1", "clip", "--runs", tree, "--experiment", "table3", "--resamples", RESAMPLES)[1]
    assert "amc23 mean@8: evaluation noise of a seed's difference 0.00 points" in same  # the same samples
