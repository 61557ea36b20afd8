"""The paper's figures (and one it does not show) from run directories, each as PNG and PDF.

figure1_kl3_bounds       KL3 = w − 1 − log w against w, the [l_δ, u_δ] band and a symmetric clip; beside it the
                         ratio interval of every registered rule that has one, and the bounds that depend on
                         π_old (DCPO, DPPO) against π_old (needs no runs)
figure2_training_curves  return, entropy, completion length (100-step moving average) and Average Mean@K per
                         evaluation step; a row per model, a line per method
figure3_delta            final Average Mean@K / Pass@K against δ (ATR runs)
figure4_passk            Average Mean@K / Pass@K against K (an evaluation with n samples per problem)
clipping_curves          clip fraction and the ratio w (mean, min–max band) per step; a row per model
Every function returns the files it wrote.
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

from atr_grpo.clipping import RULES, build_rule, kl3_ratio_bounds  # noqa: E402
from atr_grpo.plugins import load_rule_plugins  # noqa: E402
from atr_grpo.reporting.runs import AVERAGE, Run  # noqa: E402
from atr_grpo.reporting.tables import PAPER_DIR, Table  # noqa: E402
from atr_grpo.reporting.writers import claim_outputs  # noqa: E402


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
        bounds = build_rule(name).ratio_bounds()
        if bounds is not None:
            rows.append((name, *bounds))
    return rows


def rule_old_prob_bounds(old_probs: list[float]) -> dict[str, tuple[list[float], list[float]]]:
    """{rule: (lows, highs)} at `old_probs` for every registered rule whose interval depends on π_old (installed
    packages' rules included)."""
    load_rule_plugins()
    curves = {}
    for name in sorted(RULES):
        bounds = build_rule(name).old_prob_bounds(torch.tensor(old_probs, dtype=torch.float64))
        if bounds is not None:
            curves[name] = (bounds[0].tolist(), bounds[1].tolist())
    return curves


def figure1(out_dir: Path, delta: float = 0.07, eps: float | None = None) -> list[Path]:
    """(a) As in §4, the symmetric clip is drawn with ε = 1 − l_δ: both share the lower bound, and the KL3 region
    reaches further up (u_δ − 1 > ε). (b) The registry's ratio intervals at their defaults, ATR's highlighted.
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

    right_edge = 2.2  # intervals reaching further are drawn to the edge, their end written out
    rows = rule_intervals()
    for y, (name, lo, hi) in enumerate(rows):
        color = "tab:blue" if name == "atr" else "dimgray"
        ax_rules.plot([lo, min(hi, right_edge)], [y, y], color=color, linewidth=5 if name == "atr" else 3)
        end = "∞" if math.isinf(hi) else f"{hi:.3g}"
        ax_rules.text(min(hi, right_edge) + 0.03, y, f"[{lo:.3g}, {end}]", va="center", fontsize=7)
    ax_rules.axvline(1.0, color="black", linewidth=0.8)
    ax_rules.set_yticks(range(len(rows)), [name for name, _, _ in rows], fontsize=8)
    ax_rules.set(xlim=(0, right_edge + 0.5), xlabel="ratio w", title="(b) ratio interval of each rule (defaults)")
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
    return _save(fig, out_dir, "figure1_kl3_bounds")


def _by_model_method(runs: list[Run], methods: list[str] | None) -> dict[str, dict[str, list[Run]]]:
    groups: dict[str, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if methods is None or run.method in methods:
            groups[run.model][run.method].append(run)
    return {model: dict(sorted(by_method.items())) for model, by_method in sorted(groups.items())}


def _curve(runs: list[Run], key: str) -> tuple[list[int], list[float]]:
    """Per step, the mean over seeds of a metrics.jsonl key (at the steps where it was logged)."""
    values: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for row in run.metrics:
            value = row.get(key)
            if isinstance(value, (int, float)) and not math.isnan(value):
                values[int(row["step"])].append(float(value))
    steps = sorted(values)
    return steps, [sum(values[s]) / len(values[s]) for s in steps]


def _eval_curve(runs: list[Run], metric: str) -> tuple[list[int], list[float]]:
    values: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for step, row in run.eval_table(metric).items():
            if AVERAGE in row:
                values[step].append(row[AVERAGE])
    steps = sorted(values)
    return steps, [sum(values[s]) / len(values[s]) for s in steps]


def _grid(n_rows: int, n_cols: int, width: float) -> tuple[plt.Figure, list[list[plt.Axes]]]:
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width * n_cols, 3.4 * n_rows), squeeze=False)
    return fig, [list(row) for row in axes]


def figure2(runs: list[Run], out_dir: Path, window: int = 100, methods: list[str] | None = None) -> list[Path]:
    groups = _by_model_method(runs, methods)
    window = smoothing_window(runs, window)
    panels = [("reward", "return"), ("entropy", "entropy"), ("completion_length", "completion length")]
    fig, axes = _grid(len(groups), 4, 4.0)
    for row, (model, by_method) in zip(axes, groups.items()):
        for method, group in by_method.items():
            for ax, (key, _) in zip(row, panels):
                steps, values = _curve(group, key)
                if steps:
                    ax.plot(steps, moving_average(values, window, steps), label=method)
            steps, values = _eval_curve(group, f"mean@{group[0].k}")
            row[3].plot(steps, values, marker="o", markersize=3, label=method)
        for ax, (_, title) in zip(row, panels):
            ax.set_title(f"{model}: {title}", fontsize=10)
            ax.set_xlabel("step")
        row[3].set_title(f"{model}: Average Mean@{next(iter(by_method.values()))[0].k} (%)", fontsize=10)
        row[3].set_xlabel("step")
        row[3].legend(fontsize=7)
    fig.suptitle(f"Figure 2: training curves ({window}-step moving average) and evaluation", fontsize=11)
    return _save(fig, out_dir, "figure2_training_curves")


def figure_clipping(runs: list[Run], out_dir: Path, methods: list[str] | None = None) -> list[Path]:
    groups = _by_model_method(runs, methods)
    window = smoothing_window(runs, 20)
    fig, axes = _grid(len(groups), 2, 5.0)
    for (ax_frac, ax_ratio), (model, by_method) in zip(axes, groups.items()):
        for method, group in by_method.items():
            steps, frac = _curve(group, "clip/frac")
            if steps:
                ax_frac.plot(steps, moving_average(frac, window, steps), label=method)
            steps, mean = _curve(group, "ratio/mean")
            low_steps, low = _curve(group, "ratio/min")
            high_steps, high = _curve(group, "ratio/max")
            if steps:
                line = ax_ratio.plot(steps, mean, label=method)[0]
                if low_steps == high_steps == steps:  # a band only where all three were logged together
                    ax_ratio.fill_between(steps, low, high, color=line.get_color(), alpha=0.12)
        ax_frac.set_title(f"{model}: clip/frac ({window}-step moving average)", fontsize=10)
        ax_ratio.set_title(f"{model}: ratio w, mean (band: min–max)", fontsize=10)
        ax_frac.set_xlabel("step")
        ax_ratio.set(xlabel="step", yscale="log")
        ax_frac.legend(fontsize=7)
    return _save(fig, out_dir, "clipping_curves")


def figure3(table: Table, out_dir: Path) -> list[Path]:
    metrics = [c for c in table.columns if "@" in c]
    fig, axes = _grid(1, len(metrics), 4.5)
    for ax, metric in zip(axes[0], metrics):
        for model in sorted({r["model"] for r in table.rows}):
            rows = sorted((r for r in table.rows if r["model"] == model), key=lambda r: r["delta"])
            ax.plot([r["delta"] for r in rows], [r[metric] for r in rows], marker="o", label=model)
        name = metric[0].upper() + metric[1:]
        ax.set(xlabel="δ", ylabel=f"Average {name} (%)", title=f"Figure 3: {name} with varying δ")
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "figure3_delta")


def _paper_points(metric: str) -> list[tuple[int, float]]:
    """The (K, value) points §6.4 states in numbers (results/paper/passk.csv)."""
    path = PAPER_DIR / "passk.csv"
    if not path.exists():
        return []
    with path.open() as handle:
        return [
            (int(r["k"]), float(r[metric]))
            for r in csv.DictReader(handle)
            if r["benchmark"] == AVERAGE and r.get(metric)
        ]


def figure4(table: Table, out_dir: Path) -> list[Path]:
    fig, axes = _grid(1, 2, 5.0)
    average = [r for r in table.rows if r["benchmark"] == AVERAGE]
    keys = sorted({(r["model"], r["method"], r["seed"]) for r in average})
    several_seeds = len({key[:2] for key in keys}) < len(keys)
    for ax, metric in zip(axes[0], ("mean@k", "pass@k")):
        for model, method, seed in keys:
            rows = [r for r in average if (r["model"], r["method"], r["seed"]) == (model, method, seed)]
            label = f"{model} {method}" + (f" s{seed}" if several_seeds else "")
            ax.plot([r["k"] for r in rows], [r[metric] for r in rows], marker=".", label=label)
        points = _paper_points(metric)
        if points:
            ax.scatter(*zip(*points), marker="x", color="black", zorder=3, label="paper (§6.4)")
        name = metric[0].upper() + metric[1:].replace("@k", "@K")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set(xlabel="K", ylabel=f"Average {name} (%)", title=f"Figure 4: {name} with varying K")
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "figure4_passk")
