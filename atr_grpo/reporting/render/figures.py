"""The paper's figures (and one it does not show) from run directories, each as PNG and PDF.

figure1_kl3_bounds       KL3 = w − 1 − log w against w, the [l_δ, u_δ] band and a symmetric clip; beside it the
                         ratio interval of every registered rule that has one, and the bounds that depend on
                         π_old (DCPO, DPPO) against π_old (needs no runs)
figure2_training_curves  return, entropy, completion length (trailing moving average over 100 steps, or over a
                         tenth of the run when that is shorter; the window is in the title) and Average Mean@K per
                         evaluation step; a row per model, a line per method
figure3_delta            final Average Mean@K / Pass@K against δ (ATR runs)
figure4_passk            Average Mean@K / Pass@K against K (an evaluation with n samples per problem); the paper's
                         points (§6.4) only beside runs of the paper's models
clipping_curves          clip fraction and the ratio w (its smoothed min and max) per step; a row per model
parts_curves             Average Mean@K, answered rate and accuracy given an answer per evaluation step (the parts
                         of Mean@K beside it, evaluation/outcomes.py); a row per model, a line per method
Every curve is the mean over seeds with a band of ± 1 SD over them and its n in the legend (reporting/render/curves.py);
each method keeps one colour, line style and marker. Bands and bars stop at the ends of the metric's range (a rate
within 0–100 %, a fraction of tokens above 0), and step axes tick whole steps. `draw_*` return the matplotlib Figure,
the others the files they wrote.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import matplotlib
import matplotlib.ticker
import torch

matplotlib.use("Agg")  # files only: no display on clusters or in tests
import matplotlib.pyplot as plt  # noqa: E402

from atr_grpo.clipping import RULES, kl3_ratio_bounds, rule_at_defaults  # noqa: E402
from atr_grpo.plugins import load_rule_plugins  # noqa: E402
from atr_grpo.reporting.analyses import tables  # noqa: E402
from atr_grpo.reporting.metric import Metric  # noqa: E402
from atr_grpo.reporting.render.curves import (  # noqa: E402
    BAND,
    FRACTION,
    NONNEGATIVE,
    PERCENT,
    Limits,
    SeedCurve,
    clipped,
    eval_series,
    line_styles,
    metric_series,
    seed_curve,
)
from atr_grpo.reporting.render.writers import claim_outputs  # noqa: E402
from atr_grpo.reporting.runs import AVERAGE, MissingSamples, Run, mean_std  # noqa: E402

RETURN: Limits = (None, 1.0)  # a completion's reward is at most 1 (a length penalty can take it below 0)


def _save(fig: plt.Figure, out_dir: Path, name: str) -> list[Path]:
    paths = claim_outputs(out_dir, [f"{name}.png", f"{name}.pdf"])
    fig.tight_layout()
    for path in paths:  # no creation date in a PDF: a rebuild from the same runs is byte-identical
        fig.savefig(path, dpi=150, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    plt.close(fig)
    return paths


def smoothing_window(runs: list[Run], window: int = 100) -> int:
    """The paper's 100-step window for 1,000-step runs; a tenth of the run for shorter ones (so a 40-step
    demo is not flattened into a cumulative mean)."""
    spans = [row["step"] for run in runs for row in run.metrics if "step" in row]
    return max(1, min(window, (max(spans) - min(spans) + 1) // 10)) if spans else window


def moving_average(values: list[float], window: int, steps: list[int] | None = None) -> list[float]:
    """Trailing mean over the points logged in the last `window` steps, (s − window, s]; without `steps`,
    over the last `window` points. Shorter at the start, so the curve begins at the first point."""
    steps = list(range(len(values))) if steps is None else steps
    out, start, total = [], 0, 0.0
    for i, step in enumerate(steps):
        total += values[i]
        while steps[start] <= step - window:
            total -= values[start]
            start += 1
        out.append(total / (i - start + 1))
    return out


def rule_intervals() -> list[tuple[str, float, float]]:
    """(rule, low, high): the ratio interval of every registered rule that has one for all tokens, at its defaults
    (installed packages' rules included)."""
    load_rule_plugins()
    rows = []
    for name in sorted(RULES):
        bounds = rule_at_defaults(name).ratio_bounds()
        if bounds is not None:
            rows.append((name, *bounds))
    return rows


def rule_old_prob_bounds(old_probs: list[float]) -> dict[str, tuple[list[float], list[float]]]:
    """{rule: (lows, highs)} at `old_probs` for every registered rule whose interval depends on π_old (installed
    packages' rules included)."""
    load_rule_plugins()
    curves = {}
    for name in sorted(RULES):
        bounds = rule_at_defaults(name).old_prob_bounds(torch.tensor(old_probs, dtype=torch.float64))
        if bounds is not None:
            curves[name] = (bounds[0].tolist(), bounds[1].tolist())
    return curves


def draw_figure1(delta: float = 0.07, eps: float | None = None, right_edge: float = 2.2) -> plt.Figure:
    """(a) As in §4, the symmetric clip is drawn with ε = 1 − l_δ: both share the lower bound, and the KL3 region
    reaches further up (u_δ − 1 > ε). (b) The registry's ratio intervals at their defaults, ATR's highlighted; the
    axis stops at `right_edge`, and a bar that goes on ends in an arrow, its end written out (the label says so).
    (c) The rules whose interval depends on π_old(y_t), against it, over ATR's constant band."""
    low, high = kl3_ratio_bounds(delta)
    eps = 1 - low if eps is None else eps
    fig, (ax, ax_rules, ax_prob) = plt.subplots(1, 3, figsize=(17, 4.4), width_ratios=(1, 1.15, 1.15))
    ws = [0.4 + i * 0.002 for i in range(801)]
    ax.plot(ws, [w - 1 - math.log(w) for w in ws], color="black", label="KL3 = w − 1 − log w")
    ax.axhline(delta, color="gray", linestyle=":", label=f"δ = {delta:g}")
    ax.axvspan(low, high, color="tab:blue", alpha=0.15, label=f"KL3 ≤ δ: w ∈ [{low:.3f}, {high:.3f}]")
    ax.axvspan(1 - eps, 1 + eps, color="tab:red", alpha=0.12, hatch="//", fill=False)
    for x in (1 - eps, 1 + eps):
        ax.axvline(x, color="tab:red", linestyle="--")
    ax.plot([], [], color="tab:red", linestyle="--", label=f"clip ε = {eps:.3f}: [{1 - eps:.3f}, {1 + eps:.3f}]")
    ax.set(xlabel="ratio w = π_θ / π_old", ylabel="KL3", ylim=(0, 0.3), title="(a) the KL3 trust region")
    ax.legend(fontsize=7, loc="upper center")

    rows = rule_intervals()
    for y, (name, lo, hi) in enumerate(rows):
        color = "tab:blue" if name == "atr" else "dimgray"
        end = min(hi, right_edge)
        ax_rules.plot([lo, end], [y, y], color=color, linewidth=5 if name == "atr" else 3, solid_capstyle="butt")
        if hi > right_edge:
            ax_rules.plot([right_edge], [y], marker=">", markersize=8, color=color)
        text = "∞" if math.isinf(hi) else f"{hi:.3g}"
        ax_rules.text(end + 0.06, y, f"[{lo:.3g}, {text}]", va="center", fontsize=7)
    ax_rules.axvline(1.0, color="black", linewidth=0.8)
    ax_rules.set_yticks(range(len(rows)), [name for name, _, _ in rows], fontsize=8)
    cut = any(hi > right_edge for _, _, hi in rows)
    label = f"ratio w (axis cut at w = {right_edge:g}: a bar ending in ▶ goes on to the end in brackets)"
    ax_rules.set(xlim=(0, right_edge + 0.5), xlabel=label if cut else "ratio w")
    ax_rules.set_title("(b) ratio interval of each rule (defaults)")
    ax_rules.invert_yaxis()

    old_probs = [10 ** (-3 + 3 * i / 120) for i in range(120)]  # 1e-3 … 0.94
    ax_prob.axhspan(low, high, color="tab:blue", alpha=0.15, label=f"atr (δ = {delta:g})")
    for name, (lows, highs) in rule_old_prob_bounds(old_probs).items():
        line = ax_prob.plot(old_probs, highs, label=f"{name}: highest w (A > 0)")[0]
        ax_prob.plot(old_probs, lows, color=line.get_color(), linestyle="--", label=f"{name}: lowest w (A < 0)")
    ax_prob.set(xscale="log", yscale="log", ylim=(0.1, 200), xlabel="π_old(y_t)", ylabel="ratio w")
    ax_prob.set_title("(c) bounds that depend on π_old (a lowest w of 0 is not drawn)", fontsize=10)
    ax_prob.legend(fontsize=6, ncol=2, loc="upper right")
    fig.suptitle(f"Figure 1: the KL3 trust region (δ = {delta:g}) among the registry's rules", fontsize=11)
    return fig


def figure1(out_dir: Path, delta: float = 0.07, eps: float | None = None) -> list[Path]:
    return _save(draw_figure1(delta, eps), out_dir, "figure1_kl3_bounds")


def _by_model_method(runs: list[Run], methods: list[str] | None) -> dict[str, dict[str, list[Run]]]:
    groups: dict[str, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if methods is None or run.method in methods:
            groups[run.model][run.method].append(run)
    return {model: dict(sorted(by_method.items())) for model, by_method in sorted(groups.items())}


def _draw(
    ax: plt.Axes,
    curve: SeedCurve,
    style: dict[str, str],
    label: str | None,
    rank: float = 0.0,
    logs: bool = False,
    limits: Limits = (None, None),
) -> None:
    """The seeds' mean as a line with about 8 markers (shifted by `rank` ∈ [0, 1) so that methods' markers do not
    sit on each other), and ± 1 SD around it where two or more runs have the step, cut to `limits`. With `logs` the
    curve holds logarithms and is drawn as exp: the geometric mean, the band ×/÷ the geometric SD."""
    if not curve.steps:
        return
    shown = math.exp if logs else float
    every = max(1, len(curve.steps) // 8)
    means = [shown(m) for m in curve.mean]
    ax.plot(curve.steps, means, label=label, markersize=4, markevery=(int(rank * every), every), **style)
    spread = [
        (s, *clipped(shown(m - sd), shown(m + sd), limits))
        for s, m, sd in zip(curve.steps, curve.mean, curve.sd)
        if not math.isnan(sd)
    ]
    if len(spread) > 1:
        ax.fill_between(*zip(*spread), color=style["color"], alpha=0.12, linewidth=0)


def _row_legend(row: list[plt.Axes]) -> None:
    """One legend for a row, right of its last panel; a panel whose curves are labelled otherwise (a different n:
    some runs lack that metric) gets its own as well."""
    labels = row[-1].get_legend_handles_labels()[1]
    row[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    for ax in row[:-1]:
        if ax.get_legend_handles_labels()[1] != labels:
            ax.legend(fontsize=6)


def _step_axis(ax: plt.Axes) -> None:
    """An x axis of training steps: ticks on whole steps only."""
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def _grid(n_rows: int, n_cols: int, width: float) -> tuple[plt.Figure, list[list[plt.Axes]]]:
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width * n_cols, 3.4 * n_rows), squeeze=False)
    return fig, [list(row) for row in axes]


def draw_figure2(runs: list[Run], window: int = 100, methods: list[str] | None = None) -> plt.Figure:
    groups = _by_model_method(runs, methods)
    window = smoothing_window(runs, window)
    smooth = lambda values, steps: moving_average(values, window, steps)  # noqa: E731
    panels = [
        ("reward", "return", RETURN),
        ("entropy", "entropy", NONNEGATIVE),
        ("completion_length", "completion length", NONNEGATIVE),
    ]
    styles = line_styles(sorted({m for by_method in groups.values() for m in by_method}))
    fig, axes = _grid(len(groups), 4, 4.0)
    for row, (model, by_method) in zip(axes, groups.items()):
        for rank, (method, group) in enumerate(by_method.items()):
            for ax, (key, _, limits) in zip(row, panels):
                curve = seed_curve(group, metric_series(key, smooth))
                _draw(ax, curve, styles[method], curve.label(method), rank / len(by_method), limits=limits)
            curve = seed_curve(group, eval_series(str(Metric("mean", group[0].k))))
            _draw(row[3], curve, styles[method], curve.label(method), limits=PERCENT)
        k = next(iter(by_method.values()))[0].k
        titles = [title for _, title, _ in panels] + [f"Average Mean@{k} (%)"]
        for ax, title in zip(row, titles):
            ax.set_title(f"{model}: {title}", fontsize=10)
            _step_axis(ax)
        _row_legend(row)
    fig.suptitle(
        f"Figure 2: training curves ({window}-step trailing moving average) and evaluation; mean over seeds, {BAND}",
        fontsize=11,
    )
    return fig


def figure2(runs: list[Run], out_dir: Path, window: int = 100, methods: list[str] | None = None) -> list[Path]:
    return _save(draw_figure2(runs, window, methods), out_dir, "figure2_training_curves")


def draw_clipping(runs: list[Run], methods: list[str] | None = None) -> plt.Figure:
    """clip/frac, and the ratio's per-step min and max. Each is smoothed per run (the min and max swing from step to
    step as rollouts are reused), then averaged over seeds; the ratio on a log axis, as log w, so that w = 1/2 and
    w = 2 lie as far from 1 and its band stays above 0."""
    groups = _by_model_method(runs, methods)
    window = smoothing_window(runs, 20)
    smooth = lambda values, steps: moving_average(values, window, steps)  # noqa: E731
    log_smooth = lambda values, steps: smooth([math.log(v) for v in values], steps)  # noqa: E731
    styles = line_styles(sorted({m for by_method in groups.values() for m in by_method}))
    fig, axes = _grid(len(groups), 2, 5.5)
    for (ax_frac, ax_ratio), (model, by_method) in zip(axes, groups.items()):
        for rank, (method, group) in enumerate(by_method.items()):
            shift = rank / len(by_method)
            curve = seed_curve(group, metric_series("clip/frac", smooth))
            _draw(ax_frac, curve, styles[method], curve.label(method), shift, limits=FRACTION)
            high = seed_curve(group, metric_series("ratio/max", log_smooth, positive=True))
            _draw(ax_ratio, high, styles[method], high.label(method), shift, logs=True)
            low = seed_curve(group, metric_series("ratio/min", log_smooth, positive=True))
            _draw(ax_ratio, low, styles[method], None, shift, logs=True)
        ax_ratio.axhline(1.0, color="black", linewidth=0.8)
        ax_frac.set_title(f"{model}: clip/frac ({window}-step moving average)", fontsize=10)
        ax_ratio.set_title(f"{model}: ratio w, min (below 1) and max (above 1), {window}-step average", fontsize=10)
        ax_frac.set(ylabel="fraction of tokens clipped")
        ax_ratio.set(ylabel="w = π_θ / π_old (log axis)", yscale="log")
        _step_axis(ax_frac)
        _step_axis(ax_ratio)
        _row_legend([ax_frac, ax_ratio])
    fig.suptitle(f"Clipping: mean over seeds, {BAND} (the ratio's: geometric)", fontsize=11)
    return fig


def figure_clipping(runs: list[Run], out_dir: Path, methods: list[str] | None = None) -> list[Path]:
    return _save(draw_clipping(runs, methods), out_dir, "clipping_curves")


def _error_line(
    ax: plt.Axes, xs: list, values: list[list[float]], style: dict[str, str], label: str, limits: Limits = PERCENT
) -> None:
    """The mean of each x's values, with ± 1 SD bars where there are two or more, cut to `limits`."""
    pairs = [mean_std(v, ddof=1) for v in values]
    means, sds = [m for m, _ in pairs], [0.0 if math.isnan(sd) else sd for _, sd in pairs]
    ends = [clipped(m - sd, m + sd, limits) for m, sd in zip(means, sds)]
    below, above = [m - low for m, (low, _) in zip(means, ends)], [high - m for m, (_, high) in zip(means, ends)]
    ax.errorbar(xs, means, yerr=[below, above], label=label, capsize=3, markersize=5, **style)


def _n_label(name: str, counts: list[int]) -> str:
    n = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
    return f"{name} (n={n})"


def draw_figure3(runs: list[Run]) -> plt.Figure:
    """Per model, the final Average of each ATR run against its δ: the mean over seeds, ± 1 SD."""
    runs, metrics, _ = tables.prepare(runs)
    by_delta = tables.delta_groups(runs)
    models = sorted({model for model, _ in by_delta})
    styles = line_styles(models)
    fig, axes = _grid(1, len(metrics), 4.5)
    for ax, metric in zip(axes[0], metrics):
        for model in models:
            points = [
                (d, finals)
                for (m, d), g in by_delta.items()
                if m == model
                if (finals := tables.final_averages(g, metric))
            ]
            if points:
                label = _n_label(model, [len(finals) for _, finals in points])
                _error_line(ax, [d for d, _ in points], [f for _, f in points], styles[model], label)
        name = metric[0].upper() + metric[1:]
        ax.set(xlabel="δ", ylabel=f"Average {name} (%)", title=f"Figure 3: {name} with varying δ")
        ax.legend(fontsize=7)
    fig.suptitle("Final evaluation, mean over seeds (bars: ± 1 SD over seeds)", fontsize=11)
    return fig


def figure3(runs: list[Run], out_dir: Path) -> list[Path]:
    return _save(draw_figure3(runs), out_dir, "figure3_delta")


def paper_points(metric: str, model: str) -> list[tuple[int, float]]:
    """The (K, value) points of `model` that §6.4 states in numbers (results/paper/passk.csv)."""
    path = tables.PAPER_DIR / "passk.csv"
    if not path.exists():
        return []
    with path.open() as handle:
        return [
            (int(r["k"]), float(r[metric]))
            for r in csv.DictReader(handle)
            if r["benchmark"] == AVERAGE and r["model"] == model and r.get(metric)
        ]


def draw_figure4(table: tables.Table, methods: list[str] | None = None) -> plt.Figure:
    """Per model × method, the Average against K: mean over seeds, ± 1 SD; the paper's points beside its models."""
    fig, axes = _grid(1, 2, 5.0)
    average = [r for r in table.rows if r["benchmark"] == AVERAGE and (methods is None or r["method"] in methods)]
    lines: dict[tuple[str, str], dict[int, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in average:
        lines[(r["model"], r["method"])][r["k"]][r["seed"]] = r
    several_models = len({model for model, _ in lines}) > 1
    styles = line_styles([f"{model} {method}" for model, method in lines])
    for ax, metric in zip(axes[0], ("mean@k", "pass@k")):
        for rank, ((model, method), by_k) in enumerate(sorted(lines.items())):
            ks = sorted(by_k)
            name = f"{model} {method}" if several_models else method
            label = _n_label(name, [len(by_k[k]) for k in ks])
            values = [[r[metric] for r in by_k[k].values()] for k in ks]
            shift = 2 ** (0.24 * (rank / max(1, len(lines) - 1) - 0.5))  # side by side: the bars do not overlap
            _error_line(ax, [k * shift for k in ks], values, styles[f"{model} {method}"], label)
        for model in sorted({model for model, _ in lines}):
            points = paper_points(metric, model)
            if points:
                ax.scatter(*zip(*points), marker="x", color="black", zorder=3, label=f"paper (§6.4), {model}")
        name = metric[0].upper() + metric[1:].replace("@k", "@K")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({k for by_k in lines.values() for k in by_k}))  # every K drawn, 3 and 6 included
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set(xlabel="K", ylabel=f"Average {name} (%)", title=f"Figure 4: {name} with varying K")
    _row_legend(axes[0])
    fig.suptitle("Last evaluation, mean over seeds (bars: ± 1 SD over seeds)", fontsize=11)
    return fig


def figure4(table: tables.Table, out_dir: Path, methods: list[str] | None = None) -> list[Path]:
    return _save(draw_figure4(table, methods), out_dir, "figure4_passk")


PARTS_PANELS = (
    ("mean", "Mean@{k}"),
    ("answered", "answered rate@{k}"),
    ("acc_given_answer", "accuracy given an answer@{k}"),
)


def draw_parts(runs: list[Run], methods: list[str] | None = None) -> plt.Figure:
    """Per evaluation step, Average Mean@K and its two factors, the answered rate and the accuracy given an answer
    (Mean@K = answered × accuracy given an answer, `evaluation.outcomes`), so a gain can be read as more answers,
    better answers, or both. A part a run's summaries lack comes from its per-sample files; a run with neither
    gives no curve (its n falls). MissingSamples when no run gives any part."""
    groups = _by_model_method(runs, methods)
    styles = line_styles(sorted({m for by_method in groups.values() for m in by_method}))
    fig, axes = _grid(len(groups), len(PARTS_PANELS), 4.0)
    drawn = 0
    for row, (model, by_method) in zip(axes, groups.items()):
        k = next(iter(by_method.values()))[0].k
        for rank, (method, group) in enumerate(by_method.items()):
            for ax, (kind, _) in zip(row, PARTS_PANELS):
                curve = seed_curve(group, eval_series(str(Metric(kind, k)), missing_ok=True))
                _draw(ax, curve, styles[method], curve.label(method), rank / len(by_method), limits=PERCENT)
                drawn += curve.n if kind != "mean" else 0
        for ax, (_, title) in zip(row, PARTS_PANELS):
            ax.set_title(f"{model}: Average {title.format(k=k)} (%)", fontsize=10)
            _step_axis(ax)
    if not drawn:
        plt.close(fig)
        raise MissingSamples("no run has the answered rate: neither in its summary lines nor in per-sample files")
    for row in axes:
        _row_legend(row)
    fig.suptitle(
        f"What Mean@K is made of: the answered rate × the accuracy given an answer; mean over seeds, {BAND}",
        fontsize=11,
    )
    return fig


def figure_parts(runs: list[Run], out_dir: Path, methods: list[str] | None = None) -> list[Path]:
    return _save(draw_parts(runs, methods), out_dir, "parts_curves")
