"""Reading the committed results (results/mini/, results/power/): the files of a folder, the ones git keeps, and
the cells of a Markdown table's line."""

from __future__ import annotations

import subprocess


def files_under(folder):
    """Every file under `folder`, as sorted relative POSIX paths."""
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def kept_by_git(folder):
    """The files under `folder` that git keeps (tracked, or new and not ignored): a run's weights stay local."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "."],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(listing.stdout.split())


def table_cells(line):
    """The stripped cells of one line of a Markdown table."""
    return [cell.strip() for cell in line.strip("|").split("|")]


def section_lines(text, heading):
    """The lines of the Markdown section that starts with `heading` (a `## ` line), up to the next `## ` line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def assert_tables_rebuild(runs, experiment, tables, out, required):
    """`results all` on the committed runs writes into `out` exactly the committed `tables`, byte for byte, and
    they hold the `required` files."""
    from atr_grpo import results

    assert results.main(["all", "--runs", str(runs), "--experiment", experiment, "--out", str(out)]) == 0
    committed = files_under(tables)
    assert set(required) <= set(committed)
    assert files_under(out) == committed
    for name in committed:
        assert (out / name).read_bytes() == (tables / name).read_bytes(), name
