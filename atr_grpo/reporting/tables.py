"""The paper's tables rebuilt from run directories (contracts §4), written as CSV, Markdown and LaTeX.

- Table 2: per model × method, "final (best)" Mean@8 / Pass@8 on each benchmark and their Average.
  Several seeds of one (model, method) are averaged per step first.
- Table 3: per model × method, mean ± std over seeds of the final values; plus the row the paper calls
  "Clip (ε ∈ {0.1, ..., 0.5})": the ε whose mean final Average Mean@8 is highest.
- delta (Figure 3 data): ATR by δ, mean final Average Mean@8 / Pass@8 over seeds.
- passk (Figure 4 data): Mean@K / Pass@K for K = 1..n from the per-sample files of the last evaluation.
Percent values rounded to 2 decimals. Runs with missing evaluations are listed, never silently dropped.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.evaluation.metrics import summarize
from atr_grpo.evaluation.outputs import sample_file
from atr_grpo.reporting.runs import AVERAGE, Run, final_and_best, mean_std

BENCHMARK_ORDER = ["amc23", "aime24", "aime25", AVERAGE]
PAPER_DIR = Path(__file__).resolve().parents[2] / "results" / "paper"


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[dict[str, Any]]
    missing: list[str] = field(default_factory=list)  # runs with incomplete evaluations, in words
    notes: list[str] = field(default_factory=list)


def _r(value: float) -> float:
    return round(value, 2) if not math.isnan(value) else math.nan


def _metrics_of(runs: list[Run]) -> list[str]:
    k = runs[0].k
    return [f"mean@{k}", f"pass@{k}"]


def _benchmarks_of(runs: list[Run]) -> list[str]:
    names = {b for run in runs for b in run.benchmarks}
    return [b for b in BENCHMARK_ORDER[:-1] if b in names] + sorted(names - set(BENCHMARK_ORDER)) + [AVERAGE]


def _column_order(bench: str) -> int:
    return len(BENCHMARK_ORDER) if bench == AVERAGE else BENCHMARK_ORDER.index(bench) if bench in BENCHMARK_ORDER else 3


def _seed_mean_table(runs: list[Run], metric: str) -> dict[int, dict[str, float]]:
    """Per step and benchmark, the mean over the runs (seeds) that have it."""
    collected: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for step, values in run.eval_table(metric).items():
            for bench, value in values.items():
                collected[step][bench].append(value)
    return {step: {b: sum(v) / len(v) for b, v in values.items()} for step, values in sorted(collected.items())}


def _missing(runs: list[Run]) -> list[str]:
    return [f"{run.path}: {problem}" for run in runs for problem in run.problems]


def _grouped(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    groups: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        groups[(run.model, run.method)].append(run)
    return dict(sorted(groups.items()))


def table2(runs: list[Run]) -> Table:
    metrics, benches = _metrics_of(runs), _benchmarks_of(runs)
    rows = []
    for (model, method), group in _grouped(runs).items():
        for metric in metrics:
            table = _seed_mean_table(group, metric)
            for bench in benches:
                pair = final_and_best(table, bench)
                if pair is None:
                    continue
                rows.append({"model": model, "method": method, "benchmark": bench, "metric": metric,
                             "final": _r(pair[0]), "best": _r(pair[1])})  # fmt: skip
    notes = [
        "final = last evaluation step, best = maximum over evaluation steps (step 0 excluded when later steps "
        "exist); average = mean of the benchmarks at each step; several seeds are averaged per step"
    ]
    return Table("table2", ["model", "method", "benchmark", "metric", "final", "best"], rows, _missing(runs), notes)


def _final(run: Run, metric: str, bench: str) -> float | None:
    pair = final_and_best(run.eval_table(metric), bench)
    return None if pair is None else pair[0]


def table3(runs: list[Run], tuned_eps: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5)) -> Table:
    metrics, benches = _metrics_of(runs), _benchmarks_of(runs)
    rows = []
    groups = _grouped(runs)
    for (model, method), group in groups.items():
        rows.extend(_seed_rows(model, method, group, metrics, benches))
    notes = ["mean ± sample std (ddof = 1) over seeds of the final evaluation; std is blank for one seed"]
    # the paper's "Clip (ε ∈ {0.1, ..., 0.5})" row: the best ε by mean final Average Mean@K
    for model in sorted({m for m, _ in groups}):
        candidates = {}
        for (m, _method), group in groups.items():
            eps = group[0].clipping.get("eps")
            if m == model and group[0].clipping.get("name") == "clip" and eps is not None and eps in tuned_eps:
                finals = [v for r in group if (v := _final(r, metrics[0], AVERAGE)) is not None]
                if finals:
                    candidates[eps] = (sum(finals) / len(finals), group)
        if len(candidates) > 1:
            best_eps = max(candidates, key=lambda e: candidates[e][0])
            rows.extend(_seed_rows(model, "clip-tuned", candidates[best_eps][1], metrics, benches))
            tried = ", ".join(f"{e:g}" for e in sorted(candidates))
            notes.append(f"{model}: clip-tuned = clip with ε = {best_eps:g}, the best of ε ∈ {{{tried}}} "
                         f"by mean final Average {metrics[0]}")  # fmt: skip
    columns = ["model", "method", "benchmark", "metric", "mean", "std", "n_seeds"]
    return Table("table3", columns, rows, _missing(runs), notes)


def _seed_rows(model: str, method: str, group: list[Run], metrics: list[str], benches: list[str]) -> list[dict]:
    rows = []
    for metric in metrics:
        for bench in benches:
            finals = [v for run in group if (v := _final(run, metric, bench)) is not None]
            if not finals:
                continue
            mean, std = mean_std(finals)
            rows.append({"model": model, "method": method, "benchmark": bench, "metric": metric,
                         "mean": _r(mean), "std": _r(std), "n_seeds": len(finals)})  # fmt: skip
    return rows


def delta_table(runs: list[Run]) -> Table:
    metrics = _metrics_of(runs)
    by_delta: dict[tuple[str, float], list[Run]] = defaultdict(list)
    for run in runs:
        if run.clipping.get("name") == "atr":
            by_delta[(run.model, float(run.clipping["delta"]))].append(run)
    rows = []
    for (model, delta), group in sorted(by_delta.items()):
        row: dict[str, Any] = {"model": model, "delta": delta, "n_seeds": len(group)}
        for metric in metrics:
            finals = [v for r in group if (v := _final(r, metric, AVERAGE)) is not None]
            row[metric] = _r(sum(finals) / len(finals)) if finals else math.nan
        rows.append(row)
    return Table("delta", ["model", "delta", *metrics, "n_seeds"], rows, _missing(runs),
                 ["final Average over the benchmarks, mean over seeds (Figure 3)"])  # fmt: skip


def passk_table(runs: list[Run]) -> Table:
    """Mean@K / Pass@K for K = 1..n of each run's last evaluation with the most samples (Figure 4)."""
    rows, missing = [], _missing(runs)
    for run in runs:
        if not run.summary:
            continue
        n_max = max(int(row.get("n", 0)) for row in run.summary.values())
        step = max(s for (s, _), row in run.summary.items() if int(row.get("n", 0)) == n_max)
        per_bench: dict[str, dict[str, float]] = {}
        for bench in run.benchmarks:
            path = sample_file(run.path, step, bench)
            if not path.exists():
                missing.append(f"{run.path}: no per-sample file {path.name} at step {step}")
                continue
            per_bench[bench] = summarize(_correct_matrix(path))
        if not per_bench:
            continue
        for k in range(1, n_max + 1):
            for bench in [*per_bench, AVERAGE]:
                if bench == AVERAGE:
                    if len(per_bench) != len(run.benchmarks):
                        continue
                    mean = sum(v[f"mean@{k}"] for v in per_bench.values()) / len(per_bench)
                    passk = sum(v[f"pass@{k}"] for v in per_bench.values()) / len(per_bench)
                else:
                    mean, passk = per_bench[bench][f"mean@{k}"], per_bench[bench][f"pass@{k}"]
                rows.append({"model": run.model, "method": run.method, "step": step, "benchmark": bench, "k": k,
                             "mean@k": _r(100 * mean), "pass@k": _r(100 * passk)})  # fmt: skip
    columns = ["model", "method", "step", "benchmark", "k", "mean@k", "pass@k"]
    return Table("passk", columns, rows, missing, ["unbiased Pass@K from all n samples; Mean@K over the first K"])


def _correct_matrix(path: Path) -> list[list[bool]]:
    by_problem: dict[Any, dict[int, bool]] = defaultdict(dict)
    for record in rundir.iter_jsonl(path):
        by_problem[record["problem_id"]][int(record["sample"])] = bool(record["correct"])
    return [[samples[i] for i in sorted(samples)] for samples in by_problem.values()]


# ----------------------------------------------------------------------------------------------- writers
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.2f}"
    return str(value)


def write_csv(table: Table, path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=table.columns)
        writer.writeheader()
        for row in table.rows:
            writer.writerow({c: _fmt(row[c]) for c in table.columns})


def _layout(table: Table) -> tuple[list[str], list[list[str]]]:
    """The paper's layout: one row per (model, method), columns benchmark × metric."""
    if table.name not in ("table2", "table3"):
        return table.columns, [[_fmt(row[c]) for c in table.columns] for row in table.rows]
    keys = list(dict.fromkeys((r["benchmark"], r["metric"]) for r in table.rows))
    keys.sort(key=lambda bm: (_column_order(bm[0]), bm[0], bm[1]))
    cells: dict[tuple[str, str], dict[tuple[str, str], str]] = defaultdict(dict)
    for r in table.rows:
        if table.name == "table2":
            text = f"{_fmt(r['final'])} ({_fmt(r['best'])})"
        else:
            text = f"{_fmt(r['mean'])} ± {_fmt(r['std'])}" if _fmt(r["std"]) else _fmt(r["mean"])
        cells[(r["model"], r["method"])][(r["benchmark"], r["metric"])] = text
    header = ["model", "method"] + [f"{b} {m}" for b, m in keys]
    body = [[model, method] + [row.get(key, "–") for key in keys] for (model, method), row in cells.items()]
    return header, body


def to_markdown(table: Table, title: str = "") -> str:
    header, body = _layout(table)
    lines = [f"# {title or table.name}", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    for note in table.notes:
        lines += ["", f"_{note}_"]
    if table.missing:
        lines += ["", "## Missing evaluations", ""] + [f"- {m}" for m in table.missing]
    return "\n".join(lines) + "\n"


def to_latex(table: Table) -> str:
    header, body = _layout(table)

    def esc(text: str) -> str:
        return text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace("@", "@")

    lines = [r"\begin{tabular}{" + "l" * 2 + "r" * (len(header) - 2) + "}", r"\toprule"]
    lines.append(" & ".join(esc(h) for h in header) + r" \\")
    lines.append(r"\midrule")
    lines += [" & ".join(esc(c) for c in row) + r" \\" for row in body]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def compare_with_paper(table: Table, paper_csv: Path) -> str:
    """Markdown: ours next to the paper's published value and the difference, for matching cells."""
    if not paper_csv.exists():
        return ""
    value = "final" if table.name == "table2" else "mean"
    with paper_csv.open() as handle:
        paper = {
            (r["model"], r["method"], r["benchmark"], r["metric"]): float(r[value]) for r in csv.DictReader(handle)
        }
    lines = [
        f"# {table.name}: ours vs the paper ({paper_csv.name}, column `{value}`)",
        "",
        "| model | method | benchmark | metric | ours | paper | ours − paper |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    matched = 0
    for row in table.rows:
        key = (row["model"], row["method"], row["benchmark"], row["metric"])
        if key in paper:
            matched += 1
            ours = row[value]
            lines.append(f"| {' | '.join(key)} | {_fmt(ours)} | {paper[key]:.2f} | {ours - paper[key]:+.2f} |")
    lines += ["", f"_{matched} of {len(table.rows)} cells have a published counterpart._"]
    return "\n".join(lines) + "\n"


def write_table(table: Table, out_dir: Path) -> list[Path]:
    """`<name>.csv`, `<name>.md`, `<name>.tex` and, where the paper has the table, `<name>_vs_paper.md`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / f"{table.name}.csv", out_dir / f"{table.name}.md", out_dir / f"{table.name}.tex"]
    write_csv(table, written[0])
    written[1].write_text(to_markdown(table))
    written[2].write_text(to_latex(table))
    comparison = compare_with_paper(table, PAPER_DIR / f"{table.name}.csv")
    if comparison:
        written.append(out_dir / f"{table.name}_vs_paper.md")
        written[-1].write_text(comparison)
    return written
