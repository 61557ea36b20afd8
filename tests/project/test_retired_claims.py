"""Claims the power2 runs do not support stay out of the README and docs/ (the third science review, §4–5): each
was retired because it overstates what the data show, or states a theorem as a finding."""

from __future__ import annotations

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# phrase (lower case, emphasis and line breaks removed) → why it is retired
RETIRED = {
    "so the gain is the box's width": "no regime, omits the format share and the earlier designs' opposite sign",
    "not the kl shape": "at fixed δ atr is a clip box: a theorem, not a finding",
    "ordered by the upper width": "about 95 % of the freezing is on the low side",
    "the seed sd is evaluation noise": "a point estimate: σ_t up to 0.32 is allowed",
    "no number of samples makes the check pass": "not shown: the data allow σ_t up to 0.32",
    "the std is the population one (ddof 0)": "one ddof convention: the sample SD",
}


def _normal(text: str) -> str:
    """Lower case, one space between words, without Markdown emphasis."""
    return " ".join(text.replace("*", "").replace("_", " ").lower().split())


def retired_in(text: str) -> list[str]:
    """The retired phrases `text` holds."""
    normal = _normal(text)
    return [phrase for phrase in RETIRED if _normal(phrase) in normal]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_makes_a_retired_claim(page):
    found = retired_in(page.read_text())
    assert not found, {phrase: RETIRED[phrase] for phrase in found}


def test_a_retired_claim_is_found_across_a_line_break_and_emphasis():
    text = "The gain is the box's width, not the\n**KL shape**. Here the seed SD *is* evaluation noise."
    assert retired_in(text) == ["not the kl shape", "the seed sd is evaluation noise"]
