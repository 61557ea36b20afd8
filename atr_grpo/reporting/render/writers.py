"""The tables' files: `<name>.csv`, `.md` and `.tex`, and `<name>_vs_paper.md` where at least one row has a
number the paper publishes (results/paper/); runs of other models (the tiny CPU model) get none. Tables 2 and 3 are
laid out as in the paper (a row per model × method, the best value of a column in bold, † where the Holm-adjusted
seed test rejects); the seeds table as `compare` prints it. Only files this tool wrote (listed in the folder's
manifest) are ever overwritten, and never inside a run directory.

A build (`staged`) writes into a staging folder inside --out and moves its files in only once every table or figure
is written, so a build killed half-way leaves --out as the last whole build left it. While the files move in,
`BUILD_INCOMPLETE.txt` marks the folder; a kill in those moments leaves it there, and the next build removes it.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from atr_grpo import rundir
from atr_grpo.reporting import cells, stats
from atr_grpo.reporting.analyses.tables import BASE, PAPER_DIR, Table, column_name, column_order
from atr_grpo.reporting.render import compare_text
from atr_grpo.reporting.runs import AVERAGE
from atr_grpo.rundir import layout

MANIFEST = ".atr_results_manifest.json"  # the files in --out that this tool wrote (and may overwrite)


class OutputError(RuntimeError):
    pass


STAGING = ".atr_results_staging"  # inside --out: a build's files until the whole build is written
REMOVED = ".removed.json"  # in the staging folder: the names this build removes from --out
INCOMPLETE = "BUILD_INCOMPLETE.txt"  # in --out while a finished build's files move in


def _final(out_dir: Path) -> Path:
    """The folder the files end in: --out itself, or the --out of a staging folder."""
    return out_dir.parent if out_dir.name == STAGING else out_dir


def claim_outputs(out_dir: Path, names: list[str]) -> list[Path]:
    """The paths of `names` in `out_dir`, once it is clear that writing them destroys nothing of the user's:
    `out_dir` is not inside a run directory, and every existing file among them was written by this tool
    (listed in the folder's manifest; for a staging folder, in its --out's manifest)."""
    out_dir = Path(out_dir)
    for folder in (out_dir.resolve(), *out_dir.resolve().parents):
        if layout.is_run_dir(folder):
            raise OutputError(f"--out {out_dir} is inside the run directory {folder}; choose a folder outside it")
    final = _final(out_dir)
    owned = set(_owned(final))
    foreign = [name for name in names if (final / name).exists() and name not in owned]
    if foreign:
        raise OutputError(
            f"refusing to overwrite {', '.join(foreign)} in {final}: not written by "
            "python -m atr_grpo.results (move them away or choose another --out)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:  # a name may sit in a folder of its own (`<study>/table2.csv`)
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(out_dir / MANIFEST, sorted(set(_owned(out_dir)) | set(names)))
    return [out_dir / name for name in names]


def _owned(out_dir: Path) -> list[str]:
    manifest = Path(out_dir) / MANIFEST
    return json.loads(manifest.read_text()) if manifest.exists() else []


def remove_owned(out_dir: Path, names: list[str]) -> list[Path]:
    """Delete those of `names` that this tool wrote in `out_dir` (listed in its manifest), only those. In a staging
    folder, those of its --out are noted and deleted when the build moves in (`staged`)."""
    out_dir = Path(out_dir)
    if out_dir != _final(out_dir):
        stale = [n for n in _owned(out_dir.parent) if n in names]
        removed = _read_list(out_dir / REMOVED)
        rundir.write_json(out_dir / REMOVED, sorted(set(removed) | set(stale)))
        remove_owned_here = [n for n in _owned(out_dir) if n in names]
        for name in remove_owned_here:
            (out_dir / name).unlink(missing_ok=True)
        rundir.write_json(out_dir / MANIFEST, sorted(set(_owned(out_dir)) - set(remove_owned_here)))
        return [out_dir.parent / n for n in stale]
    owned = _owned(out_dir)
    stale = [n for n in owned if n in names]
    removed = [out_dir / n for n in stale if (out_dir / n).exists()]
    for path in removed:
        path.unlink()
    if stale:
        rundir.write_json(out_dir / MANIFEST, sorted(set(owned) - set(stale)))
    return removed


def remove_stale(out_dir: Path, prefix: str) -> list[Path]:
    """Delete this tool's earlier outputs named `<prefix>.*` / `<prefix>_*` (their runs are gone), only those."""
    owned = _owned(_final(Path(out_dir)))
    return remove_owned(out_dir, [n for n in owned if n.split(".")[0] == prefix or n.startswith(prefix + "_")])


def _read_list(path: Path) -> list[str]:
    return json.loads(path.read_text()) if path.exists() else []


@contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """The folder a build writes into: a staging folder in `out_dir`, whose files replace their earlier versions
    in `out_dir` (and whose removals are made) only when the body returns. A body that raises leaves `out_dir`
    as it was. OutputError, in one line naming the folder, when `out_dir` cannot be written."""
    out_dir = Path(out_dir)
    stage = out_dir / STAGING
    made = [folder for folder in (out_dir, *out_dir.parents) if not folder.exists()]  # a failed build removes them
    try:
        _clear_stage(stage)
        stage.mkdir(parents=True)
        rundir.write_json(stage / MANIFEST, [])
    except OSError as err:
        raise _unwritable(out_dir, err) from None
    try:
        yield stage
        _move_in(stage, out_dir)
    except OSError as err:
        raise _unwritable(out_dir, err) from None
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
        for folder in made:  # innermost first: the folders this build made and left empty
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def _unwritable(out_dir: Path, err: OSError) -> OutputError:
    return OutputError(f"--out {out_dir}: cannot write there ({err.strerror or err}); choose a writable folder")


def _clear_stage(stage: Path) -> None:
    """Remove the staging folder a killed build left; a folder of that name that is not one is refused."""
    if not stage.exists():
        return
    if not (stage / MANIFEST).is_file():
        raise OutputError(f"{stage} is not a staging folder of python -m atr_grpo.results; move it away")
    shutil.rmtree(stage)


def _move_in(stage: Path, out_dir: Path) -> None:
    """Move a finished build's files from `stage` into `out_dir` under the INCOMPLETE mark, then make its removals."""
    written = _owned(stage)
    removed = [n for n in _read_list(stage / REMOVED) if n not in written]
    marker = claim_outputs(out_dir, [INCOMPLETE, *written])[0]
    marker.write_text(
        "A build of python -m atr_grpo.results was moving its files into this folder and did not finish: the files\n"
        "here may come from two builds. Run the command again.\n"
    )
    for name in written:
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / name, out_dir / name)
    remove_owned(out_dir, [*removed, INCOMPLETE])


def _fmt(value: Any, spec: str = ".2f") -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, spec)
    return str(value)


def write_csv(table: Table, path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=table.columns)
        writer.writeheader()
        for row in table.rows:
            writer.writerow({c: _fmt(row[c], table.formats.get(c, ".2f")) for c in table.columns})


Cell = tuple[str, str]  # (text, the part of it to highlight: the paper bolds the best value of a column)


def _paper_grid(table: Table) -> tuple[list[tuple[str, str]], list[tuple[str, str, list[Cell]]]]:
    """Tables 2 and 3 as the paper lays them out: a row per (model, method), a column per benchmark × metric."""
    value = "final" if table.name == "table2" else "mean"
    keys = list(dict.fromkeys((r["benchmark"], r["metric"]) for r in table.rows))
    keys.sort(key=lambda bm: (column_order(bm[0]), bm[1]))
    values: dict[tuple, list[float]] = defaultdict(list)
    for r in table.rows:
        if r["method"] != BASE and not math.isnan(r[value]):
            values[(r["model"], r["benchmark"], r["metric"])].append(r[value])
    # the best value of each column; none where every method ties (no method is best)
    top = {column: max(found) for column, found in values.items() if len(found) < 2 or min(found) < max(found)}
    cells: dict[tuple[str, str], dict[tuple[str, str], Cell]] = defaultdict(dict)
    for r in table.rows:
        main = _fmt(r[value])
        strong = main if r["method"] != BASE and r[value] == top.get((r["model"], r["benchmark"], r["metric"])) else ""
        mark = "†" if stats.significant(r.get("p_holm_vs_clip", math.nan), table.alpha) else ""
        interval = "" if math.isnan(r.get("ci_low", math.nan)) else f" [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]"
        if table.name == "table2":
            best = "" if r["method"] == BASE and r["final"] == r["best"] else f" ({_fmt(r['best'])})"
            text = f"{main}{mark}{best}{interval}"
        else:
            text = f"{main}{mark} ± {'–' if math.isnan(r['std']) else _fmt(r['std'])}{interval}"
        cells[(r["model"], r["method"])][(r["benchmark"], r["metric"])] = (text, strong)
    body = [(model, method, [row.get(key, ("–", "")) for key in keys]) for (model, method), row in cells.items()]
    return keys, body


def _seeds_display(table: Table) -> tuple[list[str], list[list[str]]]:
    """The seeds table as `compare` prints it: the same cells, the same formatting."""
    level = f"{100 * (1 - table.alpha):g}%"
    header = [
        "model",
        "method",
        "benchmark",
        "metric",
        "runs",
        "mean",
        "IQM",
        "− clip",
        "per seed",
        f"{level} CI (t, seeds)",
        "p (seeds)",
        "smallest p",
        "p (Holm)",
        "†",
        "p (paired t)",
        "MDE (80%)",
        "power (observed)",
        "P(> clip)",
        f"{level} CI",
        "p (problems; these runs only)",
    ]
    body = []
    for r in table.rows:
        lead = [r["model"], r["method"], r["benchmark"], r["metric"], r["runs"], _fmt(r["mean"]), _fmt(r["iqm"])]
        diff: cells.Difference | None = r.get("difference")
        if diff is None:
            body.append(lead + ["–"] * (len(header) - len(lead)))
            continue
        robust = [
            f"{diff.improvement:.2f}",
            f"[{diff.improvement_low:.2f}, {diff.improvement_high:.2f}]",
            stats.format_p(diff.p_problems, diff.p_problems_floor),
        ]
        seed_level = compare_text.seed_level_cells(diff, r["p_holm_vs_clip"], table.alpha, r["detectable"])
        body.append(lead + seed_level + robust)
    return header, body


def _plain_rows(table: Table) -> tuple[list[str], list[list[str]]]:
    if table.name.startswith("seeds"):
        return _seeds_display(table)
    rows = table.rows
    if table.name == "passk":  # K = 1, 2, 4, ..., n of the Average: the CSV has every K and benchmark
        last_k = max((r["k"] for r in rows), default=0)
        shown = [r for r in rows if r["benchmark"] == AVERAGE] or rows
        rows = [r for r in shown if r["k"] & (r["k"] - 1) == 0 or r["k"] == last_k]

    def shown(value: Any, column: str) -> str:
        blank = isinstance(value, float) and math.isnan(value) and column in table.nan_text
        return table.nan_text[column] if blank else _fmt(value, table.formats.get(column, ".2f"))

    return table.columns, [[shown(r[c], c) for c in table.columns] for r in rows]


def _header(bench: str, metric: str) -> str:
    return f"{column_name(bench)} {metric[0].upper()}{metric[1:]} (%)"


def to_markdown(table: Table) -> str:
    lines = [f"# {table.name}", ""]
    if table.name in ("table2", "table3"):
        keys, body = _paper_grid(table)
        lines += ["| model | method | " + " | ".join(_header(*key) for key in keys) + " |"]
        lines += ["|---|---|" + "---:|" * len(keys)]
        for model, method, row_cells in body:
            texts = [text.replace(strong, f"**{strong}**", 1) if strong else text for text, strong in row_cells]
            lines.append(f"| {model} | {method} | " + " | ".join(texts) + " |")
    else:
        header, body_rows = _plain_rows(table)
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body_rows]
    lines += [""] + [f"_{note}_\n" for note in table.notes]
    if table.missing:
        lines += ["## Missing evaluations and set-aside runs", ""] + [f"- {m}" for m in table.missing] + [""]
    return "\n".join(lines)


def _tex(text: str) -> str:
    replaced = text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace("–", "--")
    for symbol, command in (("†", r"$^\dagger$"), ("−", "$-$"), ("<", "$<$"), (">", "$>$")):
        replaced = replaced.replace(symbol, command)
    return replaced


def to_latex(table: Table) -> str:
    if table.name not in ("table2", "table3"):
        header, body_rows = _plain_rows(table)
        lines = [r"\begin{tabular}{" + "l" * 2 + "r" * (len(header) - 2) + "}", r"\toprule"]
        lines += [" & ".join(_tex(h) for h in header) + r" \\", r"\midrule"]
        lines += [" & ".join(_tex(c) for c in row) + r" \\" for row in body_rows]
        return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"
    keys, body = _paper_grid(table)
    benches = list(dict.fromkeys(b for b, _ in keys))
    spans = [sum(1 for b, _ in keys if b == bench) for bench in benches]
    lines = [r"\begin{tabular}{l" + "r" * len(keys) + "}", r"\toprule"]
    lines.append(
        " & ".join(
            ["Method"] + [rf"\multicolumn{{{n}}}{{c}}{{{_tex(column_name(b))}}}" for b, n in zip(benches, spans)]
        )
        + r" \\"
    )
    start, rules = 2, []
    for n in spans:
        rules.append(rf"\cmidrule(lr){{{start}-{start + n - 1}}}")
        start += n
    lines.append(" ".join(rules))
    lines.append(" & ".join([""] + [_tex(f"{m[0].upper()}{m[1:]} (%)") for _, m in keys]) + r" \\")
    model_now = None
    for model, method, row_cells in body:
        if model != model_now:
            lines += [r"\midrule", rf"\multicolumn{{{len(keys) + 1}}}{{l}}{{\textit{{{_tex(model)}}}}} \\"]
            model_now = model
        texts = [_tex(t.replace(s, rf"\textbf{{{s}}}", 1) if s else t) for t, s in row_cells]
        lines.append(" & ".join([_tex(method), *texts]) + r" \\")
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"]) + "\n"


# The columns that identify a cell and those compared, per table with published numbers in results/paper/
COMPARED = {
    "table2": (("model", "method", "benchmark", "metric"), ("final", "best")),
    "table3": (("model", "method", "benchmark", "metric"), ("mean", "std")),
    "passk": (("model", "method", "benchmark", "k"), ("mean@k", "pass@k")),
}


def compare_with_paper(table: Table, paper_csv: Path) -> str:
    """Markdown: our value next to the paper's and the difference (ours − paper), cell by cell; "" when no row of
    ours has a published counterpart (other models than the paper's, e.g. the tiny CPU model)."""
    if table.name not in COMPARED or not paper_csv.exists():
        return ""
    keys, values = COMPARED[table.name]
    with paper_csv.open() as handle:
        paper = {tuple(r[k] for k in keys): r for r in csv.DictReader(handle)}
    header = [*keys] + [f"{what} {v}" for v in values for what in ("ours", "paper", "Δ")]
    lines = [
        f"# {table.name}: ours vs the paper (results/paper/{paper_csv.name})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(keys) + "---:|" * 3 * len(values),
    ]
    matched = set()
    for row in table.rows:
        key = tuple(str(row[k]) for k in keys)
        published = paper.get(key)
        if published is None or not any(published.get(v) for v in values):
            continue
        matched.add(key)
        cells = []
        for v in values:
            ours, theirs = row[v], float(published[v]) if published.get(v) else math.nan
            diff = ours - theirs
            cells += [_fmt(ours), _fmt(theirs), "–" if math.isnan(diff) else f"{diff:+.2f}"]
        lines.append("| " + " | ".join([*key, *cells]) + " |")
    if not matched:
        return ""
    lines += [
        "",
        f"_{len(matched)} of our {len(table.rows)} rows have a published counterpart; "
        f"{len(set(paper) - matched)} published rows have no run here._",
    ]
    if table.name == "table3":
        lines += ["", "_The paper's std is the population one (ddof 0); ours is the sample SD unless `--ddof 0`._"]
    return "\n".join(lines) + "\n"


def write_table(table: Table, out_dir: Path, folder: str = "") -> list[Path]:
    """`<name>.csv`, `<name>.md`, `<name>.tex` and, where a row has a published counterpart, `<name>_vs_paper.md`
    (an earlier one of ours is removed when none has); inside `folder` of `out_dir` when one is named."""
    comparison = compare_with_paper(table, PAPER_DIR / f"{table.name}.csv")
    prefix = f"{folder}/" if folder else ""
    if not comparison:
        remove_owned(out_dir, [f"{prefix}{table.name}_vs_paper.md"])
    names = [f"{prefix}{table.name}.{ext}" for ext in ("csv", "md", "tex")]
    names += [f"{prefix}{table.name}_vs_paper.md"] * bool(comparison)
    paths = claim_outputs(out_dir, names)
    write_csv(table, paths[0])
    paths[1].write_text(to_markdown(table))
    paths[2].write_text(to_latex(table))
    if comparison:
        paths[3].write_text(comparison)
    return paths
