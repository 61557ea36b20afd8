"""Reading a gold answer, and the normalisations a box shares with it.

A gold is read as what it is, never mined for a number in it. `parse_gold` takes these steps, in order:

1. **Wrappers come off.** Spaces; a sentence's full stop (`\\dfrac{1}{2}.`); a stray backslash at the end (`185\\`,
   `5 \\\\`, or what stripping leaves of a control space `185\\ `); math delimiters around the whole gold (`$28\\%$`,
   `$$...$$`, `\\(...\\)`, `\\[...\\]`). `$x = 1$ and $x = 2$` holds two formulas and keeps its delimiters.
2. **Notations are made plain**, in gold and box alike (`normalize_answer`). A thin-space thousands separator
   (`1\\,000`) is joined. Upright constants (`\\mathrm{e}`, `{\\rm e}`, `\\mathrm{i}`, `\\mathrm{\\pi}`) become
   plain `e`, `i` and `\\pi`, as a box writes them; `e` is then Euler's number. math-verify drops a `\\mathrm{...}`
   that ends a group as if it were a unit, so `\\frac{1}{\\mathrm{e}}` lost its denominator. `\\text{and}` or
   `\\text{or}` between answers (also `\\mbox`, `\\textrm`, with `\\,` or `\\quad` around) becomes a comma. A degree
   sign (`45°`) becomes `45^\\circ`. A repeating decimal (`0.1\\overline{6}`) becomes its fraction.
3. **A clock time** (`12:00`, `9:30 p.m.`) is read as a time, and only a time equals it. LaTeX would read `9:30` as
   the ratio 3/10.
4. **A bare number or fraction** (`33`, `033`, `27.0`, `-1`, `1,000`, `50%`, `10\\%`, `.5`, `1/2`) goes through
   math-verify's expression extractor. `10\\%` is read as 10, as before; `50%` as a percentage.
5. **A comma between digits.** Exactly three digits after it make a thousands separator (`1,000`, `7,425,000`).
   With any other number of digits after it (`1,22`, `0,5`, `3,14159`), and no space or second comma, the gold is
   ambiguous. It is read both as a decimal (1.22: a European decimal comma, as math-verify's expression extractor
   reads it) and as a list ({1, 22}, as its LaTeX extractor reads it). A box equal to either reading is correct, and
   a box of that form is read both ways too. A space after the comma (`5, 7`) or several commas (`1,2,3`) make a
   list.
6. **Anything else is parsed whole as LaTeX** (`2x+3`, `(3, -1)`, `6 - 5i`, `[1, 3)`, `\\frac{1}{2}`, `3\\sqrt{2}`).
   The expression extractor would read `2x+3` as 2. A final percent sign (`\\frac{1}{2}\\%`) is put after the math,
   where math-verify reads it as a percentage. Such a gold equals the percentage's value (1/200) and its number (1/2),
   as `50%` equals 0.5 and 50.

**Lists and tuples.** A bare list (`10, 4, -2`) or a set (`\\{10, 4, -2\\}`) is unordered. math-verify reads it as a
set, and a benchmark's list of answers is usually the list of all solutions. A tuple in brackets (`(10, 4, -2)`) is
ordered: coordinates, an ordered triple. The gold decides. Against a bare list, the order in the box never counts;
against a tuple, it always does. A set has no repeats, so `2, 2, 3` equals `2, 3`.

A gold that still parses to nothing raises `GoldParseError`, a data problem reported where benchmarks are loaded.
So does a gold of which math-verify only reads a part: its expression extractor finds the 3 in `3 sqrt(2)`. That
reading would be wrong, so the gold is refused rather than misread.
"""

from __future__ import annotations

import functools
import logging
import re

_BOXED = "\\boxed"


class GoldParseError(ValueError):
    """A gold answer that math-verify cannot parse: a data problem, never a wrong prediction."""


# ------------------------------------------------------------------------------------------ math-verify
@functools.cache
def math_verify_api() -> tuple:
    """math-verify's parse and verify, and the two extraction configs, imported once.

    Its "timeout disabled" warning is silenced: the grader bounds the time instead.
    """
    import math_verify
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    class _DropTimeoutDisabled(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "Timeout is disabled" not in record.getMessage()

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabled())
    expr = [ExprExtractionConfig()]
    latex = [LatexExtractionConfig(boxed_match_priority=0)]
    return math_verify.parse, math_verify.verify, expr, latex


def parse_with(text: str, config: list) -> list:
    """math-verify's parse with one extraction config, no fallback to the raw string and no time limit of its own."""
    parse, _, _, _ = math_verify_api()
    return parse(text, extraction_config=config, fallback_mode="no_fallback", parsing_timeout=None)


# ------------------------------------------------------------------------------------------ normalisation
# `1\,000`: a thin space between digit groups (only before exactly three digits, so `(1,\,2)` is untouched)
_THIN_SPACE_THOUSANDS = re.compile(r"(?<=\d)\\,(?=\d{3}(?!\d))")
# `\mathrm{e}`, `{\rm e}`, `\mathrm{i}`, `\mathrm{\pi}`: the constants in an upright font
_UPRIGHT_CONSTANT = re.compile(
    r"\\(?:mathrm|mathit|mathup|mathnormal|operatorname)\s*\{\s*(e|i|\\pi)\s*\}|\{\s*\\rm\s+(e|i|\\pi)\s*\}"
)
# `\text{ and }` between answers (`1 \, \text{and} \, 2`, `1\mbox{, or }2`), and the spaces and commas around it
_JOIN_WORD = re.compile(r"\\(?:text|textrm|textnormal|mbox|mathrm)\s*\{\s*,?\s*(?:and|or)\s*\}")
_GAPS = ("\\qquad", "\\quad", "\\,", "\\;", "\\:", "\\!", "\\ ", " ", "\t", "\n", "~", ",")
# `0.\overline{3}`, `1.2\bar{34}`: whole part, fixed digits, repeating digits
_REPEATING_DECIMAL = re.compile(r"(?<!\d)(\d*)\.(\d*)\\(?:overline|bar)\s*\{(\d+)\}")


def join_thin_space_thousands(text: str) -> str:
    r"""`1\,000` → `1000` (and `1\,000\,000`); other thin spaces stay."""
    return _THIN_SPACE_THOUSANDS.sub("", text)


def _constant(match: re.Match) -> str:
    name = match[1] or match[2]
    return "\\pi " if name == "\\pi" else name


def _gap_start(text: str, end: int, floor: int) -> int:
    """Where the spaces and commas that end at `end` begin (not before `floor`)."""
    while end > floor:
        gap = next((gap for gap in _GAPS if text.endswith(gap, floor, end)), None)
        if gap is None:
            break
        end -= len(gap)
    return end


def _gap_end(text: str, start: int) -> int:
    """Where the spaces and commas that begin at `start` end."""
    while (gap := next((gap for gap in _GAPS if text.startswith(gap, start)), None)) is not None:
        start += len(gap)
    return start


def _join_answers(text: str) -> str:
    r"""`1 \, \text{and} \, 2` → `1, 2`: a comma, whatever the spaces and commas around the word."""
    pieces, done = [], 0
    for match in _JOIN_WORD.finditer(text):
        if match.start() < done:
            continue
        pieces.append(text[done : _gap_start(text, match.start(), done)] + ", ")
        done = _gap_end(text, match.end())
    return "".join(pieces) + text[done:]


def _fraction_of_repeating(match: re.Match) -> str:
    whole, fixed, period = match[1], match[2], match[3]
    if len(match[0]) > 100:  # no number of a benchmark; left as written rather than turned into huge integers
        return match[0]
    numerator = int(whole + fixed + period) - int(whole + fixed or "0")
    denominator = (10 ** len(period) - 1) * 10 ** len(fixed)
    return f"\\frac{{{numerator}}}{{{denominator}}}"


def normalize_answer(text: str) -> str:
    """The notations that gold and box share, made plain (step 2 of the module docstring)."""
    text = join_thin_space_thousands(text)
    text = _UPRIGHT_CONSTANT.sub(_constant, text)
    text = _join_answers(text)
    text = text.replace("°", "^{\\circ}")
    return _REPEATING_DECIMAL.sub(_fraction_of_repeating, text)


# ------------------------------------------------------------------------------------------ wrappers
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"))
_MATH_MARK = re.compile(r"(?<!\\)\$|\\[()\[\]]")


def _without_delimiters(text: str) -> str:
    """The content of `$...$`, `$$...$$`, `\\(...\\)` or `\\[...\\]` around the whole text; else the text."""
    for opening, closing in _DELIMITERS:
        if len(text) > len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing):
            inner = text[len(opening) : -len(closing)]
            escaped_close = (len(inner) - len(inner.rstrip("\\"))) % 2 == 1  # `$5\$`: the last `$` is no delimiter
            if not escaped_close and _MATH_MARK.search(inner) is None:
                return inner
    return text


def strip_wrappers(gold: str) -> str:
    """The gold without spaces, a final full stop, stray trailing backslashes and math delimiters around it all."""
    text = str(gold)
    while True:
        before = text
        text = text.strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1]
        text = _without_delimiters(text.rstrip("\\"))
        if text == before:
            return text


# ------------------------------------------------------------------------------------------ readings
# a clock time once LaTeX wrappers are gone: `12:00`, `9:30 p.m.`, `09:30am`
_CLOCK = re.compile(r"(\d{1,2}):([0-5]\d)\s*(?:([ap])\.?\s*m\.?)?")
_CLOCK_NOISE = re.compile(r"\\(?:text|textrm|textbf|mathrm|mbox)\b|\\[,;! ]|[{}$~]")
# what math-verify's expression extractor reads whole: an integer or decimal, with a sign, thousands
# separators (`1,000` or `1 000`, groups of exactly three digits) and a percent sign (`%`, or LaTeX's `\%`,
# which it reads as the bare number, as before); or a fraction `a/b`
_BARE_NUMBER = re.compile(
    r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+|\d+)(?:\.\d+)?\s*(?:\\?%)?|[+-]?\.\d+\s*(?:\\?%)?"
    r"|[+-]?\d+\s*/\s*\d+"
)
# two digit groups joined by one comma (`1,22`; LaTeX writes `1{,}22`)
_COMMA_NUMBER = re.compile(r"([+-]?\d+)(?:,|\{,\})(\d+)")


def clock_time(text: str) -> str | None:
    """`H:MM` (a 12-hour time with a.m./p.m. on the 24-hour clock) when `text` is a clock time, else None.

    `9:30 p.m.` and `21:30` read the same; a time without a.m./p.m. is taken as written (`9:30` ≠ `9:30 p.m.`).
    """
    match = _CLOCK.fullmatch(_CLOCK_NOISE.sub("", text).strip().lower())
    if match is None:
        return None
    hour, minute, half = int(match[1]), match[2], match[3]
    if half is None:
        return f"{hour}:{minute}" if hour <= 24 else None
    if not 1 <= hour <= 12:
        return None
    return f"{hour % 12 + (12 if half == 'p' else 0)}:{minute}"


def decimal_comma(text: str) -> str | None:
    """`1,22` → `1.22` when `text` is two digit groups joined by a comma that is no thousands separator (other than
    three digits after it); None otherwise (`1,000`, `5, 7`, `1,2,3`, anything else)."""
    match = _COMMA_NUMBER.fullmatch(text)
    if match is None or len(match[2]) == 3:
        return None
    return f"{match[1]}.{match[2]}"


def _latex_readings(text: str) -> list:
    """What math-verify's LaTeX extractor reads in the gold, put in `$...$`.

    A final percent sign goes after the math, where math-verify reads a percentage. The gold is then read as the
    percentage's value (`\\frac{1}{2}\\%` is 1/200) and, as `50%` is, as its number (1/2).
    """
    _, _, _, latex = math_verify_api()
    if _BOXED in text:
        return parse_with(text, latex)
    number = text[:-1].removesuffix("\\").rstrip() if text.endswith("%") else ""
    if not number or number.endswith("\\"):
        return parse_with(f"${text}$", latex)
    return parse_with(f"${number}$\\%", latex) + parse_with(f"${number}$", latex)


@functools.lru_cache(maxsize=8192)
def parse_gold(gold: str) -> tuple:
    """The parsed gold, read as what it is (see the module docstring): a clock time as its `H:MM` string, a bare
    number or fraction through math-verify's expression extractor, a decimal comma both ways, anything else whole as
    LaTeX.

    Only a bare number goes to the expression extractor: it finds *a* number in a text, so it would read `2x+3` as 2,
    `(3, -1)` as -1 and `3\\sqrt{2}` as 3.
    """
    _, _, expr, latex = math_verify_api()
    text = normalize_answer(strip_wrappers(gold))
    clock = clock_time(text) if text else None
    decimal = decimal_comma(text)
    if clock is not None:
        parsed: list = [clock]
    elif not text:
        parsed = []
    elif decimal is not None:
        parsed = parse_with(decimal, expr) + parse_with(f"${text}$", latex)
    elif _BARE_NUMBER.fullmatch(text):
        parsed = parse_with(text, expr) or _latex_readings(text)
    else:
        parsed = _latex_readings(text)
    if not parsed:
        raise GoldParseError(f"gold answer {gold!r} does not parse with math-verify")
    return tuple(parsed)
