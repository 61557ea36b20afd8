"""The README and the pages under docs/: the README stays a front door, every relative link (file and #anchor)
resolves, and the rule table in docs/framework.md is the registry's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from atr_grpo.clipping import RULES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 220

_FENCE = re.compile(r"^\s*```")
_INLINE_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code removed (links are not links there)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(_INLINE_CODE.sub("", line))
    return lines


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, and a
    repeated anchor numbered -1, -2, ..."""
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    for line in _prose_lines(text.replace("`", "")):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        seen = counts.get(slug, 0)
        counts[slug] = seen + 1
        anchors.add(slug if seen == 0 else f"{slug}-{seen}")
    return anchors


def broken_links(page: Path) -> list[str]:
    """Every relative link of a Markdown page whose file, or whose #anchor in a Markdown file, does not exist."""
    broken = []
    for line in _prose_lines(page.read_text()):
        for target in _LINK.findall(line):
            if _SCHEME.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            if not resolved.exists():
                broken.append(f"{target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text()):
                broken.append(f"{target}: no heading with that anchor")
    return broken


def test_docs_exist_and_the_readme_is_a_front_door():
    assert len(PAGES) > 1, "docs/*.md is missing"
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to a page under docs/"
    for page in PAGES[1:]:  # every page is reachable from the README's map
        assert f"](docs/{page.name})" in "\n".join(lines), page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "other.md").write_text("# Top\n\n## A section (`make x`)\n\n## A section (`make x`)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-section-make-x) [ok](other.md#a-section-make-x-1) [ok](#here)\n"
        "[web](https://example.org/x) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n"
        "# Here\n[gone](missing.md) [bad anchor](other.md#nothing) [bad local](#nowhere)\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nothing: no heading with that anchor",
        "#nowhere: no heading with that anchor",
    ]


def test_the_rule_table_is_the_registrys():
    """docs/framework.md's rule table has the listing's header, and each of its rows is, character for character,
    the row `python -m atr_grpo.clipping --markdown` writes for that rule from the registry (summary, parameters,
    defaults, trust region, source), so the table cannot drift from the code. (A new rule's row is not required, so
    that a rule stays one class and one YAML; the README recipe says how to print it.)"""
    from atr_grpo.clipping.listing import TABLE_HEADER, table_row

    lines = (ROOT / "docs" / "framework.md").read_text().splitlines()
    start = lines.index(TABLE_HEADER[0])
    assert lines[start + 1] == TABLE_HEADER[1]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    names = [row.split("`")[1] for row in rows]
    assert len(set(names)) == len(names) and set(names) <= set(RULES)
    for name, row in zip(names, rows):
        assert row == table_row(name)
