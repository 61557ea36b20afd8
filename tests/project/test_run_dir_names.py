"""One owner of the run directory's names: only `atr_grpo/rundir/` spells a file or folder name of a run directory,
and the test helpers build run trees through it. A name spelled anywhere else is a second owner of the layout: a
change to it would pass the tests and break the product. Docstrings may describe the layout; code may not spell it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

from atr_grpo.rundir import layout

OWNER = REPO / "atr_grpo" / "rundir"
CHECKED = [REPO / "atr_grpo", REPO / "tests" / "helpers"]
# names a run directory's code might spell: every file name of `layout`, the DONE marker and the step folders
FILE_NAMES = [
    layout.CONFIG_FILE,
    layout.ENV_FILE,
    layout.METRICS_FILE,
    layout.DISCARDED_METRICS_FILE,
    layout.TRAIN_SUMMARY_FILE,
    layout.FINAL_ADAPTER,
    layout.WANDB_ID_FILE,
    layout.WANDB_EVAL_FILE,
    layout.DELTA_STATE_FILE,
    layout.SUMMARY_FILE,
    layout.REQUEST_FILE,
    layout.FAILURES_FILE,
    layout.GRADER_FILE,
    layout.CHANGES_FILE,
]
SPELLED_NAME = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, FILE_NAMES)) + r")(?![\w])")
STEP_FOLDER = re.compile(r"(^|/)" + re.escape(layout.STEP_PREFIX) + r"(\d|\*|<|$)")
WHOLE_NAMES = {layout.DONE_FILE, layout.CHECKPOINT_DIR}  # too short to look for inside other text


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (a module's, class's or function's first statement)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string in the code (docstrings aside, f-strings by their literal parts) that spells a
    run-directory name."""
    tree = ast.parse(source)
    skipped = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skipped:
            continue
        text = node.value
        if SPELLED_NAME.search(text) or STEP_FOLDER.search(text) or text in WHOLE_NAMES:
            found.append((node.lineno, text))
    return sorted(found)


def python_files() -> list[Path]:
    return [path for root in CHECKED for path in sorted(root.rglob("*.py")) if OWNER not in path.parents]


def test_only_rundir_spells_a_run_directory_name():
    files = python_files()
    assert len(files) > 100 and REPO / "tests" / "helpers" / "run_trees.py" in files
    spelled = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for path in files
        for line, text in spelled_names(path.read_text(encoding="utf-8"))
    ]
    assert spelled == [], "use atr_grpo.rundir.layout instead:\n" + "\n".join(spelled)


def test_a_spelled_name_is_found_and_a_docstring_is_not():
    source = '''
"""A run writes config.yaml and eval/step_<N>/."""
import json
from pathlib import Path

def done(run_dir):
    """Reads DONE and eval/summary.jsonl."""
    step = 5
    folder = Path(run_dir) / "eval" / f"step_{step:06d}"
    return json.loads((Path(run_dir) / "DONE").read_text()), folder / "summary.jsonl"
'''
    assert spelled_names(source) == [(9, "step_"), (10, "DONE"), (10, "summary.jsonl")]


def test_unrelated_strings_are_not_names():
    source = 'x = ("eval", "eval/*", "configs.yaml", "my_env.json", "step_time", "DONE!", "mean@8", "a/b")\n'
    assert spelled_names(source) == []


def test_the_docs_spell_a_step_folder_as_layout_names_it():
    """`layout.step_name` pads the step to six digits (step_000004): README, docs and docstrings write
    `step_<N:06d>`, never `step_<N>`, which reads as step_4."""
    assert layout.step_name(4) == "step_000004"
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "atr_grpo").rglob("*.py"))]
    unpadded = [
        f"{path.relative_to(REPO)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "step_<N>" in line
    ]
    assert unpadded == []
