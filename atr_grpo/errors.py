"""The exception every layer raises for bad input, and the guess its messages offer; it sits at the bottom of the
package and imports only the standard library."""

import difflib
from collections.abc import Callable, Iterable


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and the allowed values."""


def closest(typed: str, allowed: Iterable[str]) -> str | None:
    """The allowed name closest to what was typed (`atrr` → `atr`, `learning_rat` → `learning_rate`), or None when
    none is close enough to be a typo of it."""
    matches = difflib.get_close_matches(typed, list(allowed), n=1)
    return matches[0] if matches else None


def did_you_mean(typed: str, allowed: Iterable[str], show: Callable[[str], str] = str) -> str:
    """The tail a refusal puts before its list of allowed names: `; did you mean 'atr'?` when one is close to what was
    typed (`closest`; `show` spells it as the user should type it), else `;`."""
    close = closest(typed, allowed)
    return f"; did you mean {show(close)!r}?" if close else ";"
