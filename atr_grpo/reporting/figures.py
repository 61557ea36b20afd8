"""The paper's figures (and two it does not show) from run directories, as PNG and PDF.

Figure 1  KL3 = w − 1 − log w against w, the [l_δ, u_δ] band and a symmetric clip (needs no runs)
Figure 2  return, entropy, completion length (100-step moving average) and Average Mean@K per eval step
Figure 3  final Average Mean@K / Pass@K against δ (ATR runs)
Figure 4  Mean@K / Pass@K against K (an evaluation with n samples per problem)
extra     clip fraction and ratio (mean, with the min–max band) per step, per method
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from atr_grpo.clipping import kl3_ratio_bounds  # noqa: E402
from atr_grpo.reporting.runs import AVERAGE, Run  # noqa: E402
from atr_grpo.reporting.tables import Table  # noqa: E402


def _save(fig: plt.Figure, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return paths


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` points (shorter at the start, so short runs still plot)."""
    out, total, queue = [], 0.0, []
    for value in values:
        queue.append(value)
        total += value
        if len(queue) > window:
            total -= queue.pop(0)
        out.append(total / len(queue))
    return out


def figure1(out_dir: Path, delta: float = 0.07, eps: float = 0.2) -> list[Path]:
    low, high = kl3_ratio_bounds(delta)
    ws = [0.4 + i * 0.002 for i in range(801)]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ws, [w - 1 - math.log(w) for w in ws], color="black", label="KL3 = w − 1 − log w")
    ax.axhline(delta, color="gray", linestyle=":", label=f"δ = {delta:g}")
    ax.axvspan(low, high, color="tab:blue", alpha=0.15, label=f"ATR: [{low:.3f}, {high:.3f}]")
    for x in (1 - eps, 1 + eps):
        ax.axvline(x, color="tab:red", linestyle="--")
    ax.plot([], [], color="tab:red", linestyle="--", label=f"clip ε = {eps:g}: [{1 - eps:g}, {1 + eps:g}]")
    ax.set(xlabel="ratio w = π_θ / π_old", ylabel="KL3", ylim=(0, 0.3), title="Figure 1: the KL3 trust region")
    ax.legend(fontsize=7)
    return _save(fig, out_dir, "figure1_kl3_bounds")


def _by_method(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[f"{run.model} {run.method}"].append(run)
    return dict(sorted(groups.items()))


def _curve(runs: list[Run], key: str) -> tuple[list[int], list[float]]:
    """Per step, the mean over seeds of a metrics.jsonl key (steps where it was logged)."""
    values: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for row in run.metrics:
            if isinstance(row.get(key), (int, float)) and not math.isnan(row[key]):
                values[int(row["step"])].append(float(row[key]))
    steps = sorted(values)
    return steps, [sum(values[s]) / len(values[s]) for s in steps]


def figure2(runs: list[Run], out_dir: Path, window: int = 100) -> list[Path]:
    panels = [("reward", "return (reward)"), ("entropy", "entropy"), ("completion_length", "completion length")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
    for label, group in _by_method(runs).items():
        for ax, (key, title) in zip(axes, panels):
            steps, values = _curve(group, key)
            if steps:
                ax.plot(steps, moving_average(values, window), label=label)
            ax.set(title=f"{title} ({window}-step moving average)", xlabel="step")
        k = group[0].k
        evals: dict[int, list[float]] = defaultdict(list)
        for run in group:
            for step, values in run.eval_table(f"mean@{k}").items():
                if AVERAGE in values:
                    evals[step].append(values[AVERAGE])
        steps = sorted(evals)
        axes[3].plot(steps, [sum(evals[s]) / len(evals[s]) for s in steps], marker="o", markersize=3, label=label)
        axes[3].set(title=f"Average Mean@{k} (%)", xlabel="step")
    axes[3].legend(fontsize=7)
    return _save(fig, out_dir, "figure2_training_curves")


def figure_clipping(runs: list[Run], out_dir: Path) -> list[Path]:
    fig, (ax_frac, ax_ratio) = plt.subplots(1, 2, figsize=(10, 3.5))
    for label, group in _by_method(runs).items():
        steps, frac = _curve(group, "clip/frac")
        if steps:
            ax_frac.plot(steps, moving_average(frac, 20), label=label)
        steps, mean = _curve(group, "ratio/mean")
        _, low = _curve(group, "ratio/min")
        _, high = _curve(group, "ratio/max")
        if steps and len(low) == len(high) == len(steps):
            line = ax_ratio.plot(steps, mean, label=label)[0]
            ax_ratio.fill_between(steps, low, high, color=line.get_color(), alpha=0.1)
    ax_frac.set(title="clip/frac (20-step moving average)", xlabel="step")
    ax_ratio.set(title="ratio w: mean, band = min..max", xlabel="step", yscale="log")
    ax_frac.legend(fontsize=7)
    return _save(fig, out_dir, "clipping_curves")


def figure3(table: Table, out_dir: Path) -> list[Path]:
    metrics = [c for c in table.columns if "@" in c]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.5))
    for ax, metric in zip(axes if len(metrics) > 1 else [axes], metrics):
        for model in sorted({r["model"] for r in table.rows}):
            rows = sorted((r for r in table.rows if r["model"] == model), key=lambda r: r["delta"])
            ax.plot([r["delta"] for r in rows], [r[metric] for r in rows], marker="o", label=model)
        ax.set(xlabel="δ", ylabel=f"Average {metric} (%)", title=f"Figure 3: {metric} vs δ")
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "figure3_delta")


def figure4(table: Table, out_dir: Path) -> list[Path]:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, metric in zip(axes, ("mean@k", "pass@k")):
        keys = sorted({(r["model"], r["method"]) for r in table.rows if r["benchmark"] == AVERAGE})
        for model, method in keys:
            rows = [r for r in table.rows if (r["model"], r["method"], r["benchmark"]) == (model, method, AVERAGE)]
            ax.plot([r["k"] for r in rows], [r[metric] for r in rows], marker=".", label=f"{model} {method}")
        ax.set(xscale="log", xlabel="K", ylabel=f"Average {metric.replace('k', 'K')} (%)",
               title=f"Figure 4: {metric.replace('k', 'K')} vs K")  # fmt: skip
        ax.legend(fontsize=7)
    return _save(fig, out_dir, "figure4_passk")
