"""The package's import graph, read from the source with the AST: every import counts, function-local and
`if TYPE_CHECKING:` ones included, and importing `a.b.c` counts as importing the packages `a.b` and `a` too.

Two rules: no cycle, and no arrow up from the bottom (the rules, the loss, the config schema) into the layers
that use them (training, evaluation, reporting).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "atr_grpo"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
UPPER_LAYERS = ("atr_grpo.training", "atr_grpo.evaluation", "atr_grpo.reporting")

Edges = dict[str, dict[str, int]]  # module -> {imported module: line of the first such import}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(dotted name, line) of every import anywhere in the tree; `from x import y` gives `x.y` (a submodule or a
    name in x, decided by the caller)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names += [(f"{source}.{alias.name}", node.lineno) for alias in node.names]
    return names


def resolve(name: str, modules: set[str]) -> list[str]:
    """The package's modules that importing `name` runs: the longest prefix that is a module, and its packages."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return [".".join(parts[:i]) for i in range(end, 0, -1) if ".".join(parts[:i]) in modules]
    return []


def import_graph(root: Path = ROOT) -> Edges:
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(paths)
    edges: Edges = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets: dict[str, int] = {}
        for name, line in imported_names(tree, module, path.name == "__init__.py"):
            for target in resolve(name, modules):
                # a module's own packages run before it: they are not an import of the module's
                if target != module and not module.startswith(target + "."):
                    targets.setdefault(target, line)
        edges[module] = targets
    return edges


def find_cycle(edges: Edges) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, {})):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def describe(cycle: list[str], edges: Edges) -> str:
    return " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def is_bottom(module: str) -> bool:
    """The rules, the loss and the config schema: they must not know who uses them."""
    last = module.rsplit(".", 1)[-1]
    return (
        module == "atr_grpo.clipping"
        or module.startswith("atr_grpo.clipping.")
        or module == "atr_grpo.losses"
        or (module.count(".") == 1 and last.startswith("config"))
    )


def upward_imports(edges: Edges) -> list[str]:
    return [
        f"{module} imports {target} (line {line})"
        for module, targets in sorted(edges.items())
        if is_bottom(module)
        for target, line in sorted(targets.items())
        if any(target == layer or target.startswith(layer + ".") for layer in UPPER_LAYERS)
    ]


def test_the_package_has_no_import_cycle():
    edges = import_graph()
    assert len(edges) > 50 and "atr_grpo.training.pipeline" in edges["atr_grpo.training.stages"]
    cycle = find_cycle(edges)
    assert cycle is None, f"import cycle: {describe(cycle, edges)}"


def test_rules_losses_and_config_import_nothing_above_them():
    edges = import_graph()
    assert any(is_bottom(module) for module in edges) and is_bottom("atr_grpo.config") and is_bottom("atr_grpo.losses")
    assert upward_imports(edges) == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / PACKAGE


@pytest.mark.parametrize(
    "lazy_import",
    ["from atr_grpo.config import X", "from ..config import X", "import atr_grpo.config"],
)
def test_a_function_local_import_that_closes_a_cycle_is_found(tmp_path, lazy_import):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "config.py": "from atr_grpo.data import rows\nX = 1\n",
            "data/__init__.py": "",
            "data/rows.py": f"def load():\n    {lazy_import}\n",
        },
    )
    edges = import_graph(root)
    assert edges["atr_grpo.data.rows"] == {"atr_grpo.config": 2}
    cycle = find_cycle(edges)
    assert cycle == ["atr_grpo.config", "atr_grpo.data.rows", "atr_grpo.config"]
    assert describe(cycle, edges) == "atr_grpo.config (line 1) -> atr_grpo.data.rows (line 2) -> atr_grpo.config"


def test_an_upward_import_from_the_bottom_is_named(tmp_path):
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "config_extra.py": "",
            "losses.py": "def f():\n    from atr_grpo.evaluation.benchmarks import B\n",
            "clipping/__init__.py": "import atr_grpo.training\n",
            "evaluation/__init__.py": "",
            "evaluation/benchmarks.py": "B = 1\n",
            "training/__init__.py": "from atr_grpo import config_extra\n",
        },
    )
    edges = import_graph(root)
    assert find_cycle(edges) is None
    assert upward_imports(edges) == [
        "atr_grpo.clipping imports atr_grpo.training (line 1)",
        "atr_grpo.losses imports atr_grpo.evaluation (line 2)",
        "atr_grpo.losses imports atr_grpo.evaluation.benchmarks (line 2)",
    ]


MAX_MODULE_LINES = 400  # past this a module holds two things: split it (docs/layout.md has the map)


def long_modules(root: Path = ROOT, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The package's modules longer than `limit` lines, with their line counts."""
    lengths = {
        path.relative_to(root.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }
    return {name: n for name, n in lengths.items() if n > limit}


def test_no_module_of_the_package_is_longer_than_400_lines():
    assert len(list(ROOT.rglob("*.py"))) > 50
    assert long_modules() == {}


def test_a_module_past_the_limit_is_named_with_its_length(tmp_path):
    root = write_package(tmp_path, {"__init__.py": "", "short.py": "x = 1\n" * 3, "deep/long.py": "x = 1\n" * 4})
    assert long_modules(root, limit=3) == {"atr_grpo/deep/long.py": 4}
