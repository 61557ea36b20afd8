"""The README and the pages under docs/: the README stays a front door, every relative link (file and #anchor)
resolves, and the rule table in docs/framework.md is the registry's own."""

from __future__ import annotations

import re
from pathlib import Path
from unittest.mock import patch

import pytest
from conftest import REPO

from atr_grpo.clipping import RULES, ClipRule, register
from atr_grpo.rule_docs import (
    TABLE_BEGIN,
    TABLE_END,
    package_rules,
    rule_table,
    with_rule_table,
    write_rule_table,
    written_table,
)

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 150
DEMO_SECTION_MAX_LINES = 15  # the README's account of `make demo`, blank lines included

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
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to a page under docs/"
    for page in PAGES[1:]:  # every page is reachable from the README's map
        assert f"](docs/{page.name})" in "\n".join(lines), page.name
    start = next(i for i, line in enumerate(lines) if line.startswith("## What `make demo` shows"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    demo_lines = end - start - 1
    assert demo_lines <= DEMO_SECTION_MAX_LINES, f"the demo section has {demo_lines} lines; results go in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
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
    """docs/framework.md's rule table is, character for character, the table the registry writes (`python -m
    atr_grpo.clipping --write docs/framework.md`): one row per rule of the package, with its summary, parameters,
    defaults, trust region and source. A rule without a row, or a row that no longer says what the code says,
    fails here."""
    page = REPO / "docs" / "framework.md"
    assert written_table(page.read_text(), str(page)) == rule_table(), (
        "docs/framework.md's rule table is not the registry's; run python -m atr_grpo.clipping --write "
        "docs/framework.md"
    )


class Unlisted(ClipRule):
    """A rule of the package that the page does not list yet."""

    name = "unlisted_rule"
    family = "reference"
    summary = "−w·A"
    source = "a test"


Unlisted.__module__ = "atr_grpo.clipping.unlisted"  # as if it were defined in the package (a module with no file)


def test_the_table_check_fails_on_a_missing_or_stale_row():
    """What the check above compares: a rule registered without a row, or a row edited by hand, differs."""
    text = (REPO / "docs" / "framework.md").read_text()
    edited = text.replace(
        "| `clip` | `ratio.py` | ratio | w ∈ [1−ε, 1+ε] |", "| `clip` | `ratio.py` | ratio | w ∈ [1−ε, 1] |"
    )
    assert edited != text and written_table(edited) != rule_table()
    with patch.dict(RULES):
        register(Unlisted)
        assert "unlisted_rule" in package_rules()
        assert "| `unlisted_rule` | `atr_grpo.clipping.unlisted` | reference | −w·A | – | – | a test |" in rule_table()
        assert written_table(text) != rule_table()
        assert written_table(with_rule_table(text)) == rule_table()
    assert "unlisted_rule" not in RULES


def test_writing_the_table_replaces_only_what_lies_between_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Rules\n\nbefore\n{TABLE_BEGIN}\n| old | row |\n{TABLE_END}\nafter\n")
    assert write_rule_table(page) is True
    lines = page.read_text().splitlines()
    assert lines[:4] == ["# Rules", "", "before", TABLE_BEGIN]
    assert lines[-2:] == [TABLE_END, "after"] and "| old | row |" not in lines
    assert written_table(page.read_text()) == rule_table()
    assert write_rule_table(page) is False  # written once, the page is the registry's
    page.write_text("# Rules\n\nno markers\n")
    with pytest.raises(ValueError, match=f"{page} has no rule table between the lines"):
        write_rule_table(page)


def test_the_readmes_rule_count_is_the_registrys():
    """The front door's "(N rules, ..." counts this package's registered rules (`rule_docs.package_rules`)."""
    (count,) = re.findall(r"\((\d+) rules, each", (REPO / "README.md").read_text())
    assert int(count) == len(package_rules())
