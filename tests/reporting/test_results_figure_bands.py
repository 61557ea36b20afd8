"""What a figure shows, read from the matplotlib Figure its builder returns: every curve is the mean over seeds with
a ± 1 SD band and its n in the legend; methods differ in line style and marker, not only in colour; the ratio
panel is smoothed (no step-to-step sawtooth); the paper's Pass@K points appear only beside the paper's models;
Figure 1's axis shows every bar it labels or says where it cuts them. Also: `make tables` / `make figures` take
the experiment, and runs of a model the paper lacks get no `_vs_paper.md`."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import matplotlib.collections
import pytest
from conftest import REPO
from helpers.run_trees import BENCHES, add_parts, evals_of, make_run, write_passk_run
from omegaconf import OmegaConf

from atr_grpo.reporting import runs
from atr_grpo.reporting.analyses import tables
from atr_grpo.reporting.render import curves, figures
from atr_grpo.reporting.runs import find_runs
from atr_grpo.results import main

SEEDS = (0, 1, 2)


def _set_metric(run, key, value_at):
    """Rewrite metrics.jsonl's `key` as value_at(step)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [{**row, key: value_at(row["step"])} for row in rows]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """Two methods × 3 seeds of a tiny-model experiment: seed s has reward 0.1 · (s + 1) at every step, and a
    ratio/max that alternates 1 and 4 from step to step."""
    root = tmp_path_factory.mktemp("bands") / "runs"
    for method in ("atr", "clip"):
        for seed in SEEDS:
            evals = evals_of({0: (0.1,) * 3, 50: (0.1 + 0.1 * seed,) * 3, 100: (0.2 + 0.1 * seed,) * 3})
            run = make_run(root, "mine", "tiny", method, {"name": method}, seed, evals, 100)
            _set_metric(run, "reward", lambda step, s=seed: 0.1 * (s + 1))
            _set_metric(run, "ratio/max", lambda step: 4.0 if step % 2 else 1.0)
    return find_runs(root)


def _labels(ax):
    return ax.get_legend_handles_labels()[1]


def _line(ax, label):
    (line,) = [line for line in ax.get_lines() if line.get_label() == label]
    return line


def test_a_seed_curve_is_the_mean_and_sample_sd_over_the_runs_with_their_n(seeded):
    curve = curves.seed_curve([r for r in seeded if r.method == "atr"], curves.metric_series("reward"))
    assert curve.n == 3 and curve.label("atr") == "atr (n=3)"
    assert curve.mean[0] == pytest.approx(0.2) and curve.sd[0] == pytest.approx(0.1)  # 0.1, 0.2, 0.3; ddof 1
    one = curves.seed_curve([seeded[0]], curves.metric_series("reward"))
    assert one.n == 1 and math.isnan(one.sd[0])  # one run: no spread to draw


def test_figure2_gives_every_curve_its_n_and_a_band_of_one_sd(seeded):
    fig = figures.draw_figure2(seeded)
    row = fig.axes
    for ax in row[:4]:
        assert _labels(ax) == ["atr (n=3)", "clip (n=3)"], ax.get_title()
        bands = [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
        assert len(bands) == 2, ax.get_title()
    assert row[3].get_legend() is not None  # one legend for the row, beside its last panel
    reward = row[0]
    band = [c for c in reward.collections if isinstance(c, matplotlib.collections.PolyCollection)][0]
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.1) and ys.max() == pytest.approx(0.3)  # 0.2 ± 0.1
    assert "band: ± 1 SD over seeds" in fig.get_suptitle()


def test_methods_differ_in_line_style_and_marker_not_only_colour(seeded):
    ax = figures.draw_figure2(seeded).axes[1]
    atr, clip = _line(ax, "atr (n=3)"), _line(ax, "clip (n=3)")
    assert atr.get_linestyle() != clip.get_linestyle()
    assert atr.get_marker() != clip.get_marker()
    styles = curves.line_styles([f"m{i}" for i in range(4)])
    assert len({(s["linestyle"], s["marker"]) for s in styles.values()}) == 4
    assert len({s["linestyle"] for s in styles.values()}) == 4


def test_the_ratio_panel_is_smoothed_and_on_a_log_axis(seeded):
    """A ratio/max that swings between 1 and 4 on alternate steps is drawn as its (geometric) moving average: the
    line moves by far less than the raw swing from one step to the next."""
    fig = figures.draw_clipping(seeded)
    ratio = fig.axes[1]
    assert ratio.get_yscale() == "log"
    assert _labels(ratio) == ["atr (n=3)", "clip (n=3)"]
    ys = _line(ratio, "atr (n=3)").get_ydata()
    later = ys[20:]  # past the first window
    assert max(abs(a - b) for a, b in zip(later, later[1:])) < 0.5  # the raw series jumps by 3
    assert 1.5 < min(later) and max(later) < 2.5  # about the geometric mean of 1 and 4


def _passk_tree(root, model):
    path = write_passk_run(root, {b: [[1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]] for b in BENCHES})
    config = OmegaConf.load(path / "config.yaml")
    config.model.name = model
    OmegaConf.save(config, path / "config.yaml")
    return tables.passk_table(find_runs(root))


def _texts(fig):
    return [label for ax in fig.axes for label in _labels(ax)]


def test_figure4_shows_the_papers_points_only_beside_the_papers_models(tmp_path):
    tiny = figures.draw_figure4(_passk_tree(tmp_path / "tiny", "tiny"))
    assert not [text for text in _texts(tiny) if text.startswith("paper")]
    assert "atr (n=1)" in _texts(tiny)
    assert max(tiny.axes[1].get_xlim()) < 16  # K = 1..6: no axis stretched to the paper's K = 128
    qwen = figures.draw_figure4(_passk_tree(tmp_path / "qwen", "qwen3-1.7b"))
    assert "paper (§6.4), qwen3-1.7b" in _labels(qwen.axes[1])


def test_figure3_draws_the_mean_over_seeds_with_sd_bars_and_n(tmp_path):
    for seed, value in enumerate((0.2, 0.4)):
        evals = evals_of({50: (value,) * 3})
        make_run(tmp_path, "ablate_delta", "tiny", "atr", {"name": "atr", "delta": 0.07}, seed, evals, 50)
    fig = figures.draw_figure3(find_runs(tmp_path))
    ax = fig.axes[0]
    assert _labels(ax) == ["tiny (n=2)"]
    (bars,) = [c for c in ax.collections if isinstance(c, matplotlib.collections.LineCollection)]
    (segment,) = bars.get_segments()
    spread = 100 * math.sqrt(0.02)  # the sample SD of 20 % and 40 %, in percent
    assert sorted(segment[:, 1]) == pytest.approx([30 - spread, 30 + spread])


def test_figure1_shows_every_bar_it_labels_or_says_where_it_cuts_them():
    fig = figures.draw_figure1()
    ax = fig.axes[1]
    right = ax.get_xlim()[1]
    rows = figures.rule_intervals()
    cut = [(name, high) for name, _, high in rows if high > right]
    assert any(name == "cispo" for name, _ in cut)  # [0, 5]: wider than the axis
    assert "axis cut at w = 2.2" in ax.get_xlabel()
    arrows = [line for line in ax.get_lines() if line.get_marker() == ">"]
    assert len(arrows) == len(cut)  # each cut bar ends in an arrow
    for line in ax.get_lines():
        assert max(line.get_xdata()) <= right
    assert {text.get_text() for text in ax.texts} >= {"[0, 5]"}


@pytest.mark.skipif(shutil.which("make") is None, reason="reads the Makefile with make -n")
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["tables", "EXPERIMENT=power"],
            "-m atr_grpo.results all --runs results/power/runs --experiment power --out results/power/tables",
        ),
        (
            ["figures", "EXPERIMENT=mine", "RUNS=elsewhere/runs", "OUT=/tmp/talk", "METHODS=atr,clip"],
            "-m atr_grpo.results figures --runs elsewhere/runs --experiment mine --out /tmp/talk/figures --methods "
            "atr,clip",
        ),
        (["figures"], "-m atr_grpo.results figures --runs results/runs --out results/figures"),
        (
            ["tables", "EXPERIMENT=smoke", "STUDY=lr"],
            "-m atr_grpo.results all --runs results/runs --experiment smoke --study lr --out results/tables",
        ),
        (["figures", "STUDY=lr"], "-m atr_grpo.results figures --runs results/runs --study lr --out results/figures"),
    ],
)
def test_make_tables_and_figures_take_the_experiment(tmp_path, args, expected):
    stamp = tmp_path / ".installed"
    printed = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", str(stamp), f"VENV={tmp_path}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert expected in " ".join(printed.split())


def test_runs_of_a_model_the_paper_lacks_get_no_vs_paper_file(tmp_path, capsys):
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root, "table2", "tiny", "atr", {"name": "atr"}, seed, evals_of({0: (0.1,) * 3, 50: (0.2,) * 3}))
    out = tmp_path / "out"
    out.mkdir()
    (out / ".atr_results_manifest.json").write_text(json.dumps(["table2_vs_paper.md"]))
    (out / "table2_vs_paper.md").write_text("an earlier one of ours\n")
    assert main(["table2", "--runs", str(root), "--out", str(out), "--resamples", "100"]) == 0
    capsys.readouterr()
    assert (out / "table2.csv").exists() and not (out / "table2_vs_paper.md").exists()
    assert "table2_vs_paper.md" not in json.loads((out / ".atr_results_manifest.json").read_text())


def _bands(ax):
    return [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]


def _band_ys(ax):
    return [y for band in _bands(ax) for y in band.get_paths()[0].vertices[:, 1]]


@pytest.fixture(scope="module")
def near_the_ends(tmp_path_factory):
    """3 seeds whose Mean@8 is 0.5 at step 0, then 0.9, 0.98 and 1.0 (mean ± SD crosses 100 %), whose clip/frac is
    0, 0 and 0.03 (mean − SD below 0), and whose answered rate is 0.95, 0.98 and 1.0 at every step."""
    root = tmp_path_factory.mktemp("ends") / "runs"
    for seed, (value, frac) in enumerate(((0.9, 0.0), (0.98, 0.0), (1.0, 0.03))):
        evals = evals_of({0: (0.5,) * 3, 2: (value,) * 3, 4: (value,) * 3})
        run = make_run(root, "mine", "tiny", "atr", {"name": "atr"}, seed, evals, 4)
        add_parts(run, max(0.95, value))
        _set_metric(run, "clip/frac", lambda step, f=frac: f)
    return find_runs(root)


def test_every_band_stays_within_the_range_of_its_metric(near_the_ends):
    """A rate's band is cut at 100 %, a fraction's at 0: mean ± SD would cross both here."""
    mean_panel = figures.draw_figure2(near_the_ends).axes[3]
    assert max(_band_ys(mean_panel)) == pytest.approx(100.0)
    frac_panel = figures.draw_clipping(near_the_ends).axes[0]
    assert min(_band_ys(frac_panel)) == pytest.approx(0.0)
    for ax in figures.draw_parts(near_the_ends).axes[:3]:
        assert 0.0 <= min(_band_ys(ax)) and max(_band_ys(ax)) <= 100.0 + 1e-9, ax.get_title()


def test_step_axes_tick_whole_steps_only(near_the_ends):
    """Runs of 4 steps would otherwise get ticks at 0.5, 1.5, …"""
    fig = figures.draw_figure2(near_the_ends)
    fig.canvas.draw()
    axes = [*fig.axes[:4], *figures.draw_clipping(near_the_ends).axes[:2], *figures.draw_parts(near_the_ends).axes[:3]]
    for ax in axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)


def test_the_parts_figure_draws_mean_answered_and_accuracy_given_an_answer_per_method(seeded, near_the_ends):
    fig = figures.draw_parts(near_the_ends)
    mean, answered, accuracy = fig.axes[:3]
    assert "Mean@8" in mean.get_title() and "answered rate@8" in answered.get_title()
    assert "accuracy given an answer@8" in accuracy.get_title()
    assert all(_labels(ax) == ["atr (n=3)"] for ax in (mean, answered, accuracy))
    rates = (0.95, 0.98, 1.0)  # each seed's answered rate, at every step
    assert list(_line(answered, "atr (n=3)").get_ydata()) == pytest.approx([100 * sum(rates) / 3] * 3)
    at_start = _line(accuracy, "atr (n=3)").get_ydata()[0]  # Mean@8 is 50 % in every seed at step 0
    assert at_start == pytest.approx(sum(50 / rate for rate in rates) / 3)
    with pytest.raises(runs.MissingSamples, match="no run has the answered rate"):
        figures.draw_parts(seeded)  # neither parts in the summaries nor per-sample files


def test_figure4_ticks_every_k_it_draws(tmp_path):
    """K = 1..6 on a log-2 axis: 3, 5 and 6 get ticks of their own, not only the powers of two."""
    fig = figures.draw_figure4(_passk_tree(tmp_path / "tiny", "tiny"))
    for ax in fig.axes[:2]:
        assert list(ax.get_xticks()) == [1, 2, 3, 4, 5, 6]
        assert [label.get_text() for label in ax.get_xticklabels()] == ["1", "2", "3", "4", "5", "6"]
