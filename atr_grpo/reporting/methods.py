"""A method name as a user types it: as shown (`clip · trainer.max_steps=40`, `runs.name_methods`) or in its ASCII
form (`clip__trainer.max_steps=40`, `rundir.ascii_method`). `method_named` finds the method a typed name means, for
every command that takes one.
"""

from __future__ import annotations

from collections.abc import Iterable

from atr_grpo import rundir
from atr_grpo.errors import did_you_mean


class UnknownMethod(ValueError):
    """A typed method name that names no method of the runs (the message lists them and guesses the closest)."""


def typed_form(name: str) -> str:
    """What two spellings of one method share: its ASCII form (`rundir.ascii_method`) without white space."""
    return "".join(rundir.ascii_method(name).split())


def method_named(typed: str, names: Iterable[str], option: str = "method") -> str:
    """The method of `names` that `typed` names, as shown or in its ASCII form (`clip__trainer.max_steps=40` for
    `clip · trainer.max_steps=40`); UnknownMethod naming `option`, the methods (with their ASCII forms) and the
    closest one."""
    forms: dict[str, set[str]] = {}
    for name in names:
        forms.setdefault(typed_form(name), set()).add(name)
    found = sorted(forms.get(typed_form(typed), ()))
    if len(found) == 1:
        return found[0]
    if found:
        raise UnknownMethod(f"{option} {typed!r} names several methods: {', '.join(found)}")
    every = sorted(n for same in forms.values() for n in same)
    shown = [n if rundir.ascii_method(n) == n else f"{n} (ASCII: {rundir.ascii_method(n)})" for n in every]
    guess = did_you_mean(typed_form(typed), forms, show=lambda form: sorted(forms[form])[0])
    raise UnknownMethod(f"{option} {typed!r}: no such method{guess} methods: {', '.join(shown) or 'none'}")
