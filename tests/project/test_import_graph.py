"""The package's import graph, read from the source with the AST: every import counts, function-local and
`if TYPE_CHECKING:` ones included, and importing `a.b.c` counts as importing the packages `a.b` and `a` too.

Three rules: no cycle; no arrow up from the bottom (the rules, the loss, the config schema) into the layers that
use them (training, evaluation, reporting); and `clipping/` is pure tensor code (no model, trainer or I/O). A module
past 400 lines is reported as a warning, not refused: size is a hint, the concepts are the rule.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = "atr_grpo"
ROOT = REPO / PACKAGE
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


# ------------------------------------------------------------------------------- clipping/ is pure tensor code
RULES_PACKAGE = "atr_grpo.clipping"
# what a rule module may not import (a name or anything under it), and why; torch.nn.functional is allowed: its
# functions are stateless tensor maths, while the rest of torch.nn is modules that hold parameters
FORBIDDEN_IN_RULES = {
    "torch.nn": "a torch.nn module",
    "torch.distributed": "process groups",
    "transformers": "a model library",
    "peft": "a model library",
    "unsloth": "a model library",
    "unsloth_zoo": "a model library",
    "vllm": "a model library",
    "accelerate": "a trainer library",
    "trl": "a trainer library",
    "verl": "a trainer library",
    "datasets": "I/O (data sets)",
    "hydra": "the config layer",
    "omegaconf": "the config layer",
    "wandb": "I/O (logging)",
    "json": "I/O (file formats)",
    "yaml": "I/O (file formats)",
    "pickle": "I/O (file formats)",
    "csv": "I/O (file formats)",
    "importlib.metadata": "I/O (entry points)",
    "pkg_resources": "I/O (entry points)",
    "subprocess": "I/O (processes)",
    "shutil": "I/O (files)",
}
ALLOWED_IN_RULES = ("torch.nn.functional",)
# calls that read or write files: `open(...)`, `path.read_text()` and the like, `torch.load/save(...)`
IO_FUNCTIONS = ("open",)
IO_METHODS = ("read_text", "read_bytes", "write_text", "write_bytes")
IO_TORCH = ("torch.load", "torch.save")
# a model reached by duck typing (no import needed): calls only a module or a Hugging Face model has
MODEL_METHODS = (
    "named_parameters",
    "parameters",
    "named_modules",
    "get_decoder",
    "get_input_embeddings",
    "get_output_embeddings",
    "get_base_model",
    "generate",
)
# state saved with a checkpoint belongs to the trainer that saves it
CHECKPOINT_METHODS = ("state_dict", "load_state_dict")
# the command line of the registry is written outside it (`atr_grpo.rule_docs`, which loads installed plugins)
ENTRY_POINT_IMPORTS = {f"{RULES_PACKAGE}.__main__": ("atr_grpo.rule_docs",)}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def forbidden_import(name: str) -> str | None:
    """Why a rule module may not import `name` (None: it may)."""
    if any(_under(name, allowed) for allowed in ALLOWED_IN_RULES):
        return None
    return next((why for prefix, why in FORBIDDEN_IN_RULES.items() if _under(name, prefix)), None)


def dotted(node: ast.AST) -> str | None:
    """`torch.nn.Linear` for the attribute chain torch → nn → Linear; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def io_and_model_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each file call, model call, checkpoint method and torch.nn attribute (outside
    torch.nn.functional) in the tree."""
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}  # a.b inside a.b.c
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func, name = node.func, dotted(node.func)
            if isinstance(func, ast.Name) and func.id in IO_FUNCTIONS:
                found.append((node.lineno, f"calls {func.id}() (I/O)"))
            elif isinstance(func, ast.Attribute) and func.attr in IO_METHODS:
                found.append((node.lineno, f"calls .{func.attr}() (I/O)"))
            elif isinstance(func, ast.Attribute) and func.attr in MODEL_METHODS:
                found.append((node.lineno, f"calls .{func.attr}() (a model)"))
            elif name in IO_TORCH:
                found.append((node.lineno, f"calls {name}() (I/O)"))
        elif isinstance(node, ast.FunctionDef) and node.name in CHECKPOINT_METHODS:
            found.append((node.lineno, f"defines {node.name}() (checkpointed state)"))
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            name = dotted(node)
            if name and name.startswith("torch.nn.") and forbidden_import(name):
                found.append((node.lineno, f"uses {name} (a torch.nn module)"))
    return found


def impurities(root: Path = ROOT) -> list[str]:
    """'file:line what' for everything under clipping/ that is not pure tensor code: a forbidden import (see
    FORBIDDEN_IN_RULES), an import of the package outside clipping/ (models, trainers and I/O live there), a file
    call, a model's method, checkpointed state, or a torch.nn module."""
    edges = import_graph(root)
    found: list[tuple[str, int, str]] = []
    for path in sorted((root / "clipping").rglob("*.py")):
        module = module_name(path, root)
        where = path.relative_to(root.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, line in imported_names(tree, module, path.name == "__init__.py"):
            if why := forbidden_import(name):
                found.append((where, line, f"imports {name} ({why})"))
        allowed = ENTRY_POINT_IMPORTS.get(module, ())
        for target, line in edges[module].items():
            if not _under(target, RULES_PACKAGE) and target not in allowed:
                found.append((where, line, f"imports {target} (the package outside clipping/)"))
        found += [(where, line, what) for line, what in io_and_model_uses(tree)]
    return [f"{where}:{line} {what}" for where, line, what in sorted(found)]


def test_the_rules_are_pure_tensor_code():
    """Nothing under clipping/ imports a model, trainer, config or I/O library or the package outside clipping/,
    calls a file or a model, or keeps checkpointed state (the list of `impurities`)."""
    assert len(list((ROOT / "clipping").rglob("*.py"))) > 10
    assert impurities() == []


def test_a_model_trainer_or_file_in_the_rules_is_named(tmp_path):
    """Each kind of impurity is named with its file and line; torch.nn.functional, path arithmetic and the command
    line's plugin import are not."""
    root = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "plugins.py": "",
            "rule_docs.py": "",
            "training/__init__.py": "",
            "clipping/__init__.py": "import torch.nn.functional as F\nfrom torch.nn.functional import softplus\n",
            "clipping/__main__.py": "from atr_grpo.rule_docs import main\n",
            "clipping/layer.py": "from torch import nn\nimport torch\n\nx = torch.nn.Linear(2, 2)\n",
            "clipping/model.py": (
                "def f(model):\n    from transformers import AutoModel\n    import atr_grpo.training\n"
                "    return dict(model.named_parameters())\n\n\nclass Control:\n    def state_dict(self):\n"
                "        return {}\n"
            ),
            "clipping/files.py": (
                "import json\nfrom importlib.metadata import entry_points\nfrom pathlib import Path\n"
                "p = Path('a') / 'b'\nt = p.read_text()\nwith open(p) as f:\n    pass\n"
                "import torch\ntorch.save(1, p)\ny = torch.nn.functional.relu(torch.zeros(1))\n"
            ),
            "clipping/plugins_here.py": "from atr_grpo import plugins\n",
        },
    )
    assert impurities(root) == [
        "atr_grpo/clipping/files.py:1 imports json (I/O (file formats))",
        "atr_grpo/clipping/files.py:2 imports importlib.metadata.entry_points (I/O (entry points))",
        "atr_grpo/clipping/files.py:5 calls .read_text() (I/O)",
        "atr_grpo/clipping/files.py:6 calls open() (I/O)",
        "atr_grpo/clipping/files.py:9 calls torch.save() (I/O)",
        "atr_grpo/clipping/layer.py:1 imports torch.nn (a torch.nn module)",
        "atr_grpo/clipping/layer.py:4 uses torch.nn.Linear (a torch.nn module)",
        "atr_grpo/clipping/model.py:2 imports transformers.AutoModel (a model library)",
        "atr_grpo/clipping/model.py:3 imports atr_grpo.training (the package outside clipping/)",
        "atr_grpo/clipping/model.py:4 calls .named_parameters() (a model)",
        "atr_grpo/clipping/model.py:8 defines state_dict() (checkpointed state)",
        "atr_grpo/clipping/plugins_here.py:1 imports atr_grpo.plugins (the package outside clipping/)",
    ]


# ------------------------------------------------------------------------------------- size: a warning only
MODULE_LINES_HINT = 400  # past this a module may hold two concepts: worth a look, not a failure


def long_modules(root: Path = ROOT, limit: int = MODULE_LINES_HINT) -> dict[str, int]:
    """The package's modules longer than `limit` lines, with their line counts."""
    lengths = {
        path.relative_to(root.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }
    return {name: n for name, n in lengths.items() if n > limit}


def test_long_modules_are_reported_as_a_warning():
    """A module past the hint is named in a warning (pytest's summary shows it); it does not fail the suite: a
    module is split where a concept boundary is, never to meet a line count."""
    assert len(list(ROOT.rglob("*.py"))) > 50
    for name, lines in long_modules().items():
        warnings.warn(f"{name} has {lines} lines (hint: {MODULE_LINES_HINT}): does it hold two concepts?", stacklevel=1)


def test_a_module_past_the_limit_is_named_with_its_length(tmp_path):
    root = write_package(tmp_path, {"__init__.py": "", "short.py": "x = 1\n" * 3, "deep/long.py": "x = 1\n" * 4})
    assert long_modules(root, limit=3) == {"atr_grpo/deep/long.py": 4}
