"""Rules and benchmarks from installed packages, found through entry points.

A package ships a clipping rule or a benchmark by naming, in its own `pyproject.toml`, a module whose import
registers it (`@register` from `atr_grpo.clipping`, `register_benchmark` from `atr_grpo.benchmarks`):

    [project.entry-points."atr_grpo.rules"]
    log_clip = "my_package.log_clip"

    [project.entry-points."atr_grpo.benchmarks"]
    math500 = "my_package.math500"

Rules load where a user's rule name is looked up: `load_rule_plugins` is called by the config layer (before it
makes each rule's schema), by `python -m atr_grpo.clipping` and by the verl plugin. Importing `atr_grpo.clipping`
loads nothing: it stays pure tensor code with the built-in rules. Benchmarks load when `atr_grpo.benchmarks` is
first imported, before `config` checks `eval.benchmarks`. The entry point's name is a label for messages; the
module decides what it registers.

An entry point whose module fails to import stops the program with `PluginError`, naming the entry point and its
distribution: a rule or benchmark that silently went missing would change what a run measures.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points

RULE_GROUP = "atr_grpo.rules"
BENCHMARK_GROUP = "atr_grpo.benchmarks"


class PluginError(RuntimeError):
    """An installed package's rule or benchmark module cannot be imported. (Not an ImportError: code that treats a
    missing optional dependency as absent must not pass over a broken plugin.)"""


@contextmanager
def broken_plugins_stop_the_command() -> Iterator[None]:
    """Around an entry point's imports, which read the installed plugins: a broken one ends the process with its
    message on one line and exit status 2 (bad input, like a bad config), not a traceback."""
    try:
        yield
    except PluginError as err:
        print(f"error: {err}; fix or uninstall that package", file=sys.stderr)
        raise SystemExit(2) from None


def describe(entry_point: EntryPoint) -> str:
    """`'log_clip = my_package.log_clip' (group atr_grpo.rules) of the distribution my-package 0.1`."""
    dist = entry_point.dist
    where = f"the distribution {dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"{entry_point.name} = {entry_point.value!r} (group {entry_point.group}) of {where}"


def load_entry_points(group: str) -> list[str]:
    """Import every module `group`'s entry points name, in name order; returns the entry points' names.

    Importing is what registers, so a second call imports nothing new except entry points that appeared since
    (Python keeps each imported module)."""
    loaded = []
    for entry_point in sorted(entry_points(group=group), key=lambda ep: (ep.name, ep.value)):
        try:
            entry_point.load()
        except Exception as err:
            raise PluginError(
                f"cannot load the entry point {describe(entry_point)}: {type(err).__name__}: {err} "
                "(fix that package, or uninstall it)"
            ) from err
        loaded.append(entry_point.name)
    return loaded


def load_rule_plugins() -> list[str]:
    """Register the rules installed packages declare (`RULE_GROUP`); returns their entry points' names. Call it
    before a user's rule name is looked up in `atr_grpo.clipping.RULES`."""
    return load_entry_points(RULE_GROUP)
