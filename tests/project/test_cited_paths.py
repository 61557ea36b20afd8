"""Every repo path the README, the docs, the notebooks and the package's docstrings and comments cite exists: a file
moved or renamed leaves no reader with a path to nothing. A cited path is one under a top folder of the repo
(`atr_grpo/losses.py`, `tests/clipping/`, `conf/eval/paper.yaml`, `results/mini/tables/`) or a dotted module
name (`atr_grpo.training.stages`). Placeholders match anything: `<exp>`, `{name}`, `${m}`, `NAME`, `*`, `...`.
A path under results/ counts where it names committed results (results/mini/...), not a run's output folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

from atr_grpo.clipping import RULES
from atr_grpo.plugins import BENCHMARK_GROUP, RULE_GROUP

TOP_FOLDERS = ("atr_grpo", "tests", "tests_verl", "scripts", "conf", "docs", "results", "examples", "notebooks")
# a path: a top folder, then path characters; placeholders <x>, {x} and * inside
_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP_FOLDERS)})/[\w.*<>{{}}$/:,-]*)")
_PLACEHOLDER = re.compile(r"<[^>]*>|\$?\{[^}]*\}|\$\w+|\.\.\.|(?<![\w.])[A-Z][A-Z_]+(?![\w.])")
_MODULE = re.compile(r"(?<![\w./-])(atr_grpo(?:\.[A-Za-z_]\w*)+)")
# folders under results/ that hold run outputs, ignored by git (.gitignore), not committed results
_UNCOMMITTED = {"runs", "cache", "demo", "tables", "figures"}
# files the docs show how to write, not files of the repo
EXAMPLES = {
    "atr_grpo/benchmarks/math500.py",  # docs/evaluation.md: a new benchmark
    "atr_grpo/clipping/log_clip.py",  # docs/rules.md: a new rule, its config and its test
    "conf/clipping/log_clip.yaml",
    "tests/clipping/test_log_clip.py",
    "examples/dppo_trainer",  # verl's folder, not ours
}


def cited_in() -> list[Path]:
    """The README, the pages under docs/, the notebooks and the package's Python files."""
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "notebooks").glob("*.ipynb")),
        *sorted((REPO / "atr_grpo").rglob("*.py")),
    ]


def _as_glob(cited: str) -> str | None:
    """The glob pattern a cited path stands for, or None where it is no path (a URL, a format string)."""
    path = _PLACEHOLDER.sub("*", cited)
    path = path.split(":")[0].rstrip(".,")  # drop a line number (`kl.py:63`) and the sentence's full stop
    return path.rstrip("/") or None


def missing_paths(text: str) -> list[str]:
    """The cited paths in `text` that match no file or folder of the repo."""
    missing = []
    for cited in _PATH.findall(text):
        pattern = _as_glob(cited)
        if pattern is None or pattern in EXAMPLES or not _committed(pattern):
            continue
        if not any(REPO.glob(pattern)) and not (REPO / pattern).exists():
            missing.append(cited)
    return missing


def _committed(pattern: str) -> bool:
    """Whether a path is one of the repo's: anything outside results/, and under results/ a committed folder's."""
    top, _, rest = pattern.partition("/")
    if top != "results":
        return True
    folder = rest.split("/")[0]
    return folder not in _UNCOMMITTED and "*" not in folder and (REPO / "results" / folder).is_dir()


def _module_source(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_modules(text: str) -> list[str]:
    """The dotted names in `text` whose module does not exist, or whose name after the module (a function, a
    class, a submodule) the module does not define or import. `atr_grpo.<rule>` is a verl policy loss's name."""
    missing = []
    for dotted in _MODULE.findall(text):
        parts = dotted.split(".")
        if len(parts) == 2 and parts[1] in RULES:  # the verl plugin's name for a rule's policy loss
            continue
        if dotted in (RULE_GROUP, BENCHMARK_GROUP):  # the entry-point groups plugins declare
            continue
        known = next((n for n in range(len(parts), 0, -1) if _module_source(parts[:n])), 0)
        if known == len(parts):
            continue
        source = _module_source(parts[:known])
        if source is None or not _defines(source.read_text(), parts[known]):
            missing.append(dotted)
    return missing


def _defines(source: str, name: str) -> bool:
    """Whether a module's source defines or imports `name` (a mention in a docstring is not enough)."""
    name = re.escape(name)
    pattern = rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|^\s*(?:from|import)\b[^\n]*\b{name}\b"
    return re.search(pattern, source, re.MULTILINE) is not None


@pytest.mark.parametrize("page", cited_in(), ids=lambda path: str(path.relative_to(REPO)))
def test_every_cited_path_exists(page):
    """Each repo path and module a page or module cites names something that exists."""
    text = page.read_text()
    assert missing_paths(text) + missing_modules(text) == [], f"{page.relative_to(REPO)} cites what does not exist"


def test_the_check_finds_a_stale_path():
    """A path or module that was moved counts as missing; a placeholder or a line number does not."""
    assert missing_paths("see tests/test_rivals_bandpo.py and `atr_grpo/losses.py:12`") == [
        "tests/test_rivals_bandpo.py"
    ]
    assert missing_paths("conf/clipping/<name>.yaml, conf/{trainer,eval}/paper.yaml, results/runs/x") == []
    assert missing_modules("atr_grpo.training.unsloth_backend and atr_grpo.clipping.base.ClipRule") == [
        "atr_grpo.training.unsloth_backend"
    ]
