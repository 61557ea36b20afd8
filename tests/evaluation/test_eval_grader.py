"""Grading: golden cases (math-verify 0.9.0), how golds are read, the final-box rule, <think>, truncation, timeouts and
the worker pool."""

import sys
import threading
import time

import pytest
from conftest import REPO

from atr_grpo import rundir
from atr_grpo.data.arithmetic import OPERATIONS, make_splits
from atr_grpo.evaluation import (
    GoldParseError,
    grade,
    grade_many,
    grade_sample,
    grade_samples,
    last_boxed,
    load_benchmark,
)
from atr_grpo.evaluation.gold import parse_gold
from atr_grpo.evaluation.grader import GradingTimeout, status_counts, time_limit
from atr_grpo.evaluation.pool import run_with_deadline

FIXTURES = REPO / "tests" / "fixtures" / "eval"
MINI_RUNS = REPO / "results" / "mini" / "runs"

# (completion, gold, expected verdict)
GOLDEN = [
    # leading zeros, both ways (AIME golds such as "033")
    ("The answer is $\\boxed{033}$.", "33", True),
    ("So we get \\boxed{33}", "033", True),
    # integer-valued float golds (AMC) and decimals
    ("\\boxed{27}", "27.0", True),
    ("\\boxed{27.0}", "27", True),
    ("\\boxed{27.5}", "27", False),
    # fractions and decimals
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{1}{2}}", "1/2", True),
    ("\\boxed{1/2}", "\\frac12", True),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{3}", True),
    ("\\boxed{0.33}", "\\frac{1}{3}", False),
    # several boxes: the last one wins, also when they are close together
    ("First \\boxed{5}. Wait, correcting: \\boxed{7}", "7", True),
    ("First \\boxed{5}. Wait, correcting: \\boxed{7}", "5", False),
    ("\\boxed{5}\\boxed{7}", "7", True),
    ("remainder is \\boxed{004}.\n\n**Final Answer**\n\\boxed{004}", "4", True),
    # nested braces inside the final box
    ("Thus $\\boxed{\\frac{\\sqrt{2}}{2}}$", "\\frac{\\sqrt{2}}{2}", True),
    ("\\boxed{2^{1/2}}", "\\sqrt{2}", True),
    # text after the answer
    ("\\boxed{5} and then some more text, with 7 and 9 in it.", "5", True),
    ("The answer is \\boxed{12}. Let me double check: 3 * 4 = 12. Yes.", "12", True),
    # no answer: no box, and no fallback to the last number
    ("The answer is 42", "42", False),
    ("Let x = 7. Then 3x + 1 = 22 and so the answer is 7", "7", False),
    ("\\boxed{}", "1", False),
    # LaTeX noise
    ("\\boxed{5 \\text{ apples}}", "5", True),
    ("\\boxed{12\\text{ cm}}", "12", True),
    ("$\\boxed{\\$5}$", "5", True),
    ("\\boxed{5\\!000}", "5000", True),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{\\textbf{42}}", "42", True),
    ("\\boxed{ $42$ }", "42", True),
    ("\\boxed{42.}", "42", True),
    ("\\boxed{x = 5}", "5", True),
    # negative numbers
    ("\\boxed{-7}", "-7", True),
    ("\\boxed{-7}", "7", False),
    ("\\boxed{7}", "-7", False),
    ("\\boxed{-1}", "-1.0", True),
    # LaTeX golds are parsed whole (the expression extractor alone would read `3\\sqrt{2}` as 3)
    ("\\boxed{1024}", "2^{10}", True),
    ("\\boxed{2}", "2^{10}", False),
    ("\\boxed{3\\sqrt{2}}", "3\\sqrt{2}", True),
    ("\\boxed{3}", "3\\sqrt{2}", False),
    # plainly wrong
    ("\\boxed{34}", "33", False),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), GOLDEN)
def test_golden_cases(completion, gold, expected):
    assert grade(completion, gold) is expected


def test_grade_many_agrees_with_grade_in_order():
    pairs = [(c, g) for c, g, _ in GOLDEN]
    expected = [grade(c, g) for c, g in pairs]
    assert grade_many(pairs, workers=2) == expected == [e for _, _, e in GOLDEN]


# A gold without LaTeX markup is read as what it is: a number only when it is a bare number or fraction, else
# an expression, tuple, interval, complex number, list or clock time, never a number mined out of it.
GOLD_READING = [
    # expressions: `2x+3` is not the number 2
    ("\\boxed{2x+3}", "2x+3", True),
    ("\\boxed{3+2x}", "2x+3", True),
    ("\\boxed{2}", "2x+3", False),
    ("\\boxed{2x+4}", "2x+3", False),
    ("\\boxed{x^2+1}", "x^2+1", True),
    ("\\boxed{x^2}", "x^2+1", False),
    ("\\boxed{y=2x+3}", "y = 2x + 3", True),
    ("\\boxed{2x+3}", "y = 2x + 3", True),
    ("\\boxed{2}", "y = 2x + 3", False),
    # tuples and intervals: `(3, -1)` is not -1
    ("\\boxed{(3, -1)}", "(3, -1)", True),
    ("\\boxed{\\left(3,-1\\right)}", "(3, -1)", True),
    ("\\boxed{-1}", "(3, -1)", False),
    ("\\boxed{(-1, 3)}", "(3, -1)", False),
    ("\\boxed{[1,3)}", "[1, 3)", True),
    ("\\boxed{(1,3)}", "[1, 3)", False),
    ("\\boxed{3}", "[1, 3)", False),
    # complex numbers
    ("\\boxed{6-5i}", "6 - 5i", True),
    ("\\boxed{-5i+6}", "6 - 5i", True),
    ("\\boxed{6+5i}", "6 - 5i", False),
    ("\\boxed{5}", "6 - 5i", False),
    # lists: the order does not matter, every element does
    ("\\boxed{5, 7}", "5, 7", True),
    ("\\boxed{7,5}", "5, 7", True),
    ("\\boxed{\\{5, 7\\}}", "5, 7", True),
    ("\\boxed{7}", "5, 7", False),
    ("\\boxed{5}", "5, 7", False),
    ("\\boxed{1,2,3}", "1,2,3", True),
    ("\\boxed{3}", "1,2,3", False),
    # clock times: only a time equals a time (LaTeX alone reads 9:30 as the ratio 3/10, and 12:00 as 12/0)
    ("\\boxed{12:00}", "12:00", True),
    ("\\boxed{\\text{12:00 p.m.}}", "12:00", True),
    ("\\boxed{12}", "12:00", False),
    ("\\boxed{12:30}", "12:00", False),
    ("\\boxed{5:00}", "12:00", False),
    ("\\boxed{9:30}", "09:30", True),
    ("\\boxed{\\frac{3}{10}}", "9:30", False),
    ("\\boxed{9:30 \\text{ p.m.}}", "21:30", True),
    ("\\boxed{9:30\\text{ a.m.}}", "9:30 a.m.", True),
    ("\\boxed{9:30 pm}", "9:30 a.m.", False),
    ("\\boxed{9:30 \\text{ p.m.}}", "9:30", False),  # a time without a.m./p.m. is taken as written
    # thousands: commas and thin spaces, in gold and box
    ("\\boxed{1000}", "1\\,000", True),
    ("\\boxed{1\\,000}", "1000", True),
    ("\\boxed{1\\,000\\,000}", "1000000", True),
    ("\\boxed{1{,}000}", "1\\,000", True),
    ("\\boxed{0}", "1\\,000", False),
    ("\\boxed{1}", "1\\,000", False),
    ("\\boxed{7,425,000}", "7425000", True),
    ("\\boxed{7425000}", "7,425,000", True),
    ("\\boxed{7425}", "7,425,000", False),
    ("\\boxed{(1,\\,2)}", "(1, 2)", True),  # a thin space after a comma is no thousands separator
    # bare numbers, fractions and percentages read as before
    ("\\boxed{0.4}", ".4", True),
    ("\\boxed{-\\frac{10}{9}}", "-10/9", True),
    ("\\boxed{\\frac{10}{9}}", "-10/9", False),
    ("\\boxed{28\\%}", "28%", True),
    ("\\boxed{0.28}", "28%", True),
    ("\\boxed{5}", "+5", True),
    ("\\boxed{-5}", "+5", False),
    ("\\boxed{10\\%}", "10\\%", True),
    ("\\boxed{10}", "10\\%", True),
    ("\\boxed{11}", "10\\%", False),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), GOLD_READING)
def test_golds_are_read_as_what_they_are(completion, gold, expected):
    assert grade(completion, gold) is expected


@pytest.mark.parametrize(
    ("gold", "reading"),
    [
        ("2x+3", "2*x + 3"),
        ("(3, -1)", "(3, -1)"),
        ("5, 7", "{5, 7}"),
        ("[1, 3)", "Interval.Ropen(1, 3)"),
        ("12:00", "12:00"),
        ("9:30 p.m.", "21:30"),
        ("1\\,000", "1000"),
        ("1,000", "1000"),
        ("-3/4", "-3/4"),
    ],
)
def test_parse_gold_reads_the_whole_gold(gold, reading):
    assert str(parse_gold(gold)[0]) == reading


def test_a_gold_that_is_no_number_and_no_latex_fails_loudly():
    """`3 sqrt(2)` was read as 3 by the expression extractor; it is now refused where benchmarks are loaded."""
    with pytest.raises(GoldParseError, match="3 sqrt"):
        parse_gold("3 sqrt(2)")


# Golds that math-verify reads and the grader once refused (or misread), one list per class of gold. Each list is
# checked whole: a gold that raises counts as a wrong verdict.
def verdicts(cases):
    """The verdict of each (completion, gold, _) case; "GoldParseError" where the gold was refused."""
    out = []
    for completion, gold, _ in cases:
        try:
            out.append(grade(completion, gold))
        except GoldParseError:
            out.append("GoldParseError")
    return out


def expected(cases):
    return [verdict for _, _, verdict in cases]


MATH_DELIMITED = [
    ("\\boxed{28\\%}", "$28\\%$", True),
    ("\\boxed{28}", "$28\\%$", True),  # read as `28\%` is: the bare number, as before
    ("\\boxed{29}", "$28\\%$", False),
    ("\\boxed{20}", "$20\\%$", True),
    ("\\boxed{12.5\\%}", "$12.5\\%$", True),
    ("\\boxed{5}", "\\[5\\]", True),
    ("\\boxed{6}", "\\[5\\]", False),
    ("\\boxed{\\frac{1}{2}}", "$$\\frac{1}{2}$$", True),
    ("\\boxed{5}", "$x = 1$ and $x = 5$", False),  # two formulas: not one delimited gold
]


def test_a_gold_inside_math_delimiters_is_read_as_its_content():
    assert verdicts(MATH_DELIMITED) == expected(MATH_DELIMITED)


LATEX_PERCENT = [
    ("\\boxed{\\frac{1}{2}\\%}", "\\frac{1}{2}\\%", True),
    ("\\boxed{\\frac{1}{2}\\%}", "$\\frac{1}{2}\\%$", True),
    ("\\boxed{\\frac{1}{3}\\%}", "\\frac{1}{2}\\%", False),
    ("\\boxed{0.005}", "\\frac{1}{2}\\%", True),  # the percentage's value
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}\\%", True),  # and its number, as `50%` equals 0.5 and 50
    ("\\boxed{50}", "\\frac{1}{2}\\%", False),
]


def test_a_percent_sign_after_latex_makes_a_percentage():
    assert verdicts(LATEX_PERCENT) == expected(LATEX_PERCENT)


UPRIGHT_CONSTANTS = [
    ("\\boxed{1 - e^{-1}}", "$1 - \\frac{1}{\\mathrm{e}}$", True),
    ("\\boxed{1 - \\frac{1}{\\mathrm{e}}}", "$1 - \\frac{1}{\\mathrm{e}}$", True),
    ("\\boxed{\\frac{e - 1}{e}}", "1 - \\frac{1}{\\mathrm{e}}", True),
    ("\\boxed{1}", "$1 - \\frac{1}{\\mathrm{e}}$", False),
    ("\\boxed{1 - \\frac{1}{e}}", "1 - \\frac{1}{{\\rm e}}", True),
    ("\\boxed{e - 1}", "\\mathrm{e} - 1", True),  # `e` is Euler's number in both, not a symbol in one
    ("\\boxed{2e}", "2\\mathrm{e}", True),
    ("\\boxed{2}", "2\\mathrm{e}", False),  # an upright e is no unit to drop
    ("\\boxed{\\sqrt{e}}", "\\sqrt{\\mathrm{e}}", True),
    ("\\boxed{1+i}", "1 + \\mathrm{i}", True),
    ("\\boxed{1-i}", "1 + \\mathrm{i}", False),
    ("\\boxed{\\pi}", "\\mathrm{\\pi}", True),
]


def test_upright_constants_are_the_constants():
    assert verdicts(UPRIGHT_CONSTANTS) == expected(UPRIGHT_CONSTANTS)


TRAILING_BACKSLASH = [
    ("\\boxed{185}", "185\\", True),
    ("\\boxed{186}", "185\\", False),
    ("\\boxed{185}", "185\\ ", True),  # a control space at the end, once stripped
    ("\\boxed{5}", "5 \\\\", True),
    ("\\boxed{(1, 2)}", "(1, 2) \\\\", True),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
]


def test_a_stray_backslash_after_the_gold_is_dropped():
    assert verdicts(TRAILING_BACKSLASH) == expected(TRAILING_BACKSLASH)


FULL_STOP = [
    ("\\boxed{\\frac{1}{2}}", "\\dfrac{1}{2}.", True),
    ("\\boxed{185}", "185.", True),
    ("\\boxed{186}", "185.", False),
    ("\\boxed{W(n) = -1, W(n) = 1}", "W(n) = 1 \\text{ and } W(n) = -1.", True),
]


def test_a_sentences_full_stop_after_the_gold_is_dropped():
    assert verdicts(FULL_STOP) == expected(FULL_STOP)


JOINED_BY_AND = [
    ("\\boxed{W(n) = 1 \\text{ and } W(n) = -1}", "W(n) = 1 \\text{ and } W(n) = -1", True),
    ("\\boxed{W(n) = -1, W(n) = 1}", "W(n) = 1 \\, \\text{and} \\, W(n) = -1", True),
    ("\\boxed{W(n) = -1, W(n) = 1}", "W(n) = 1 \\mbox{ and } W(n) = -1", True),
    ("\\boxed{W(n) = -1, W(n) = 1}", "W(n) = 1 \\textrm{ or } W(n) = -1", True),
    ("\\boxed{W(n) = -1, W(n) = 1}", "W(n) = 1 \\text{, and } W(n) = -1", True),
    ("\\boxed{W(n) = 1}", "W(n) = 1 \\, \\text{and} \\, W(n) = -1", False),
    ("\\boxed{W(n) = 1 \\; \\text{or} \\; W(n) = -1}", "W(n) = 1, W(n) = -1", True),
    ("\\boxed{x = 1 \\, \\text{or} \\, x = 2}", "x = 1, x = 2", True),
    ("\\boxed{x = 1 \\, \\text{or} \\, x = 3}", "x = 1, x = 2", False),
]


def test_answers_joined_by_and_or_or_are_a_list():
    assert verdicts(JOINED_BY_AND) == expected(JOINED_BY_AND)


# A comma between digits: three digits after it make a thousands separator (`1,000`); other than three, with no
# space and no second comma, a decimal comma (`1,22`, math-verify's reading) or a list of two numbers (LaTeX's)
COMMA_DECIMAL = [
    ("\\boxed{1.22}", "1,22", True),
    ("\\boxed{1,22}", "1,22", True),
    ("\\boxed{122}", "1,22", False),
    ("\\boxed{1.2}", "1,22", False),
    ("\\boxed{0.5}", "0,5", True),
    ("\\boxed{\\frac{1}{2}}", "0,5", True),
    ("\\boxed{-1.5}", "-1,5", True),
    ("\\boxed{3.14159}", "3,14159", True),  # math-verify's expression extractor reads 3141 here
    ("\\boxed{1.5}", "1,5", True),
    ("\\boxed{1, 5}", "1,5", True),  # the other reading of the same gold
    ("\\boxed{-1, 1}", "-1,1", True),
    ("\\boxed{1.22}", "1.22", True),
    ("\\boxed{1,22}", "1.22", True),  # a box is read both ways too
    ("\\boxed{1.22}", "1, 22", False),  # a space after the comma: a list
    ("\\boxed{1,22}", "1, 22", True),
    ("\\boxed{1000}", "1,000", True),
    ("\\boxed{1}", "1,000", False),
    ("\\boxed{1.5}", "1,500", False),
    ("\\boxed{1.22}", "1,2,2", False),
]


def test_a_comma_between_digits_is_a_thousands_separator_or_a_decimal_comma():
    assert verdicts(COMMA_DECIMAL) == expected(COMMA_DECIMAL)


DEGREE_SIGN = [
    ("\\boxed{45^\\circ}", "45°", True),
    ("\\boxed{45}", "45°", True),
    ("\\boxed{46}", "45°", False),
    ("\\boxed{45°}", "45", True),
]


def test_a_degree_sign_is_degrees():
    assert verdicts(DEGREE_SIGN) == expected(DEGREE_SIGN)


REPEATING_DECIMAL = [
    ("\\boxed{\\frac{1}{3}}", "0.\\overline{3}", True),
    ("\\boxed{0}", "0.\\overline{3}", False),
    ("\\boxed{0.3}", "0.\\overline{3}", False),
    ("\\boxed{\\frac{5}{3}}", "1.\\overline{6}", True),
    ("\\boxed{\\frac{1}{6}}", "0.1\\overline{6}", True),
    ("\\boxed{0.1}", "0.1\\overline{6}", False),  # LaTeX alone read 0.1 times a symbol
    ("\\boxed{\\frac{4}{11}}", "0.\\overline{36}", True),
    ("\\boxed{-\\frac{1}{3}}", "-0.\\overline{3}", True),
    ("\\boxed{0.\\overline{3}}", "\\frac{1}{3}", True),
    ("\\boxed{0.\\bar{3}}", "\\frac{1}{3}", True),
]


def test_a_repeating_decimal_is_its_fraction():
    assert verdicts(REPEATING_DECIMAL) == expected(REPEATING_DECIMAL)


# The decision on lists: a bare list (`10, 4, -2`) or a set (`\{10, 4, -2\}`) is unordered, as math-verify reads it
# (a list of all solutions); a tuple in brackets (`(10, 4, -2)`) is ordered (coordinates, an ordered triple). The gold
# decides: against a bare list a box's order never matters, against a tuple it always does (math-verify's verify sorts
# the elements of a set before it compares them, and keeps a tuple's in place).
UNORDERED_LISTS = [
    ("\\boxed{4, 10, -2}", "10, 4, -2", True),
    ("\\boxed{-2, 4, 10}", "10, 4, -2", True),
    ("\\boxed{\\{4, 10, -2\\}}", "10, 4, -2", True),
    ("\\boxed{(4, 10, -2)}", "10, 4, -2", True),
    ("\\boxed{4, 10}", "10, 4, -2", False),
    ("\\boxed{4, 10, -2, 3}", "10, 4, -2", False),
    ("\\boxed{2, 3}", "2, 2, 3", True),  # a set has no repeats
    ("\\boxed{4, 10, -2}", "\\{10, 4, -2\\}", True),
    ("\\boxed{(10, 4, -2)}", "(10, 4, -2)", True),
    ("\\boxed{(4, 10, -2)}", "(10, 4, -2)", False),
    ("\\boxed{4, 10, -2}", "(10, 4, -2)", False),
    ("\\boxed{10, 4, -2}", "(10, 4, -2)", True),
]


def test_a_bare_list_is_unordered_and_a_tuple_ordered():
    assert verdicts(UNORDERED_LISTS) == expected(UNORDERED_LISTS)


THINKING = [
    # (completion, status without credit inside <think>, status with it)
    ("<think>so it is \\boxed{7}</think>The answer is \\boxed{7}.", "correct", "correct"),
    ("<think>so it is \\boxed{7}</think>The answer is 7.", "no_answer", "correct"),
    ("<think>so it is \\boxed{7}", "no_answer", "correct"),  # never stopped thinking: no answer given
    ("so it is \\boxed{7}</think>Done.", "no_answer", "correct"),  # the template opened <think> in the prompt
    ("<think>maybe \\boxed{5}</think>\\boxed{7}", "correct", "correct"),
    ("<think>a</think><think>b \\boxed{7}</think>\\boxed{5}", "wrong", "wrong"),
    ("<think>a \\boxed{7}</think> b <think>c</think> d", "no_answer", "correct"),  # answered after the last one
    ("No thinking at all: \\boxed{7}", "correct", "correct"),
]


@pytest.mark.parametrize(("completion", "without", "with_credit"), THINKING)
def test_a_box_inside_think_counts_only_when_asked(completion, without, with_credit):
    assert grade_sample(completion, "7").status == without
    assert grade_sample(completion, "7", credit_inside_think=True).status == with_credit
    assert grade(completion, "7") is (without == "correct")
    assert grade(completion, "7", credit_inside_think=True) is (with_credit == "correct")


def test_the_think_setting_reaches_the_worker_processes():
    items = [(c, "7", "stop") for c, _, _ in THINKING]
    for credit, column in ((False, 1), (True, 2)):
        pooled = grade_samples(items, workers=2, credit_inside_think=credit)
        assert [r.status for r in pooled] == [case[column] for case in THINKING]
    assert grade_many([(THINKING[1][0], "7")], workers=0) == [False]
    assert grade_many([(THINKING[1][0], "7")], workers=0, credit_inside_think=True) == [True]


def test_a_truncated_thought_records_no_box_without_credit():
    """`extracted` is the box of the answer part: the one that would have been graded."""
    assert grade_sample("<think>so \\boxed{7} but", "7", "length").extracted is None
    assert grade_sample("<think>so \\boxed{7} but", "7", "length", credit_inside_think=True).extracted == "7"


def shipped_golds():
    """Every gold this repository ships: the fixture benchmarks, the arithmetic task and the committed mini runs."""
    golds = set()
    for name in ("amc23", "aime24", "aime25"):
        golds |= {p.gold for p in load_benchmark(name, FIXTURES / f"{name}.jsonl", strict=False).problems}
    train, evals = make_splits(2000, 64, 20, list(OPERATIONS), seed=0)
    golds |= {p.answer for p in train + evals}
    for path in MINI_RUNS.glob("*/eval/step_*/*.jsonl*"):
        golds |= {str(record["gold"]) for record in rundir.read_jsonl(path)}
    return sorted(golds)


def test_every_shipped_gold_grades_itself_correct():
    golds = shipped_golds()
    assert len(golds) > 100 and {"84", "-1", "24"} <= set(golds)
    assert [g for g in golds if not grade(f"The final answer is $\\boxed{{{g}}}$.", g)] == []


@pytest.mark.parametrize(
    ("text", "box"),
    [
        ("a \\boxed{1} b \\boxed{2} c", "2"),
        ("\\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),
        ("\\boxed {3}", "3"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not close the group
        ("use \\boxed for answers: \\boxed{9}", "9"),
        ("\\boxed{4} then \\boxed{5", None),  # the final box never closes: malformed, no answer
        ("no box here", None),
        ("\\boxed{\\boxed{6}}", "6"),
    ],
)
def test_last_boxed_matches_braces(text, box):
    assert last_boxed(text) == box


def test_statuses_and_extracted_answer():
    assert grade_sample("\\boxed{033}", "33") == grade_sample("\\boxed{033}", "33", "stop")
    assert grade_sample("\\boxed{033}", "33").status == "correct"
    assert grade_sample("\\boxed{034}", "33").status == "wrong"
    wrong = grade_sample("x \\boxed{5 \\text{ apples}}", "6")
    assert (wrong.status, wrong.correct, wrong.extracted) == ("wrong", False, "5 \\text{ apples}")
    assert grade_sample("the answer is 33", "33").status == "no_answer"
    assert grade_sample("the answer is 33", "33").extracted is None


def test_a_truncated_sample_is_never_credited():
    """An unfinished answer is not final: even a correct box in a sample cut at max_tokens scores 0."""
    result = grade_sample("... so it is \\boxed{33}. But wait, let me re", "33", "length")
    assert (result.status, result.correct, result.extracted) == ("truncated", False, "33")
    assert grade_sample("reasoning without an end", "33", "length").status == "truncated"


def test_unknown_finish_reason_and_bad_gold_raise():
    with pytest.raises(ValueError, match="finish_reason"):
        grade_sample("\\boxed{1}", "1", "abort")
    with pytest.raises(GoldParseError):
        grade("\\boxed{1}", "")


def test_status_counts_has_every_status():
    results = grade_samples([("\\boxed{1}", "1", "stop"), ("x", "1", "stop"), ("\\boxed{1}", "1", "length")], workers=0)
    assert status_counts(results) == {"correct": 1, "wrong": 0, "no_answer": 1, "truncated": 1, "timeout": 0}


# Answers whose grading outlasts a 0.5 s timer (a tower of powers, a factorial, hundreds of nested fractions,
# thousands of chained terms). Each ends as "timeout", or as "wrong" where a library swallowed the interrupt and
# returned what it had parsed so far (or a fast machine finished the sum in time). Which of the two depends on the
# clock, so it is never compared.
TIMED_OUT = [
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}",
    "\\boxed{" + "1+" * 5000 + "1}",
    "\\boxed{(10^{10})!}",
]
CUT_OFF = ("timeout", "wrong")
# Hostile texts graded in milliseconds, far from any timer (a box never closed, braces only, a long text before
# the final box): their verdicts are fixed
HOSTILE = [
    ("\\boxed{" * 50_000, "no_answer"),
    ("}" * 10_000 + "{" * 10_000, "no_answer"),
    ("x" * 200_000 + "\\boxed{5}", "correct"),  # a long text before the final box is fine
]


@pytest.fixture(scope="module")
def timed_out_serial():
    started = time.monotonic()
    results = [grade_sample(text, "5", timeout=0.5) for text in TIMED_OUT]
    return results, time.monotonic() - started


def test_answers_past_the_timer_never_hang_or_count(timed_out_serial):
    """Each answer is cut off after its 0.5 s (the whole list within a bound on wall time) and never credited."""
    results, seconds = timed_out_serial
    assert seconds < len(TIMED_OUT) * 1.0 + 5
    assert all(r.status in CUT_OFF and not r.correct for r in results), [r.status for r in results]
    assert [r.extracted for r in results] == [last_boxed(text) for text in TIMED_OUT]


def test_hostile_texts_get_their_verdict_without_crashing():
    results = [grade_sample(text, "5") for text, _ in HOSTILE]
    assert [r.status for r in results] == [status for _, status in HOSTILE]


def test_answers_past_the_timer_in_the_pool_are_bounded_and_cut_off(timed_out_serial):
    """In worker processes the same answers end within a bound on wall time, each cut off like in the serial run
    (each side's "timeout" or "wrong" is its own timer's doing, so the two are not compared verdict by verdict)."""
    started = time.monotonic()
    pooled = grade_samples([(text, "5", "stop") for text in TIMED_OUT], workers=2, timeout=0.5)
    assert time.monotonic() - started < 15
    assert all(r.status in CUT_OFF and not r.correct for r in pooled), [r.status for r in pooled]
    assert [r.extracted for r in pooled] == [r.extracted for r in timed_out_serial[0]]


def test_hostile_texts_in_the_pool_agree_with_the_serial_verdicts():
    pooled = grade_samples([(text, "5", "stop") for text, _ in HOSTILE], workers=2)
    assert [r.status for r in pooled] == [status for _, status in HOSTILE]


def test_grade_works_off_the_main_thread():
    """math-verify's own signal timeouts raise in threads; ours switch off there instead."""
    out = []
    thread = threading.Thread(target=lambda: out.append(grade("\\boxed{\\frac{1}{2}}", "0.5")))
    thread.start()
    thread.join(timeout=30)
    assert out == [True]


class SpinsInItsFinalizer:
    """An object whose finalizer runs past the answer timer: the timer's interrupt lands where nothing can catch it."""

    def __del__(self):
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass


class FailsInItsFinalizer:
    def __del__(self):
        raise ValueError("the finalizer's own error")


class SlowHook:
    """A `sys.unraisablehook` that takes longer than the timer's re-firing interval (as pytest's does, formatting the
    traceback): what it was given, and what it finished handling."""

    def __init__(self):
        self.given, self.finished = [], []

    def __call__(self, unraisable):
        self.given.append(unraisable.exc_type)
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            pass
        self.finished.append(unraisable.exc_type)


def test_the_timer_firing_in_a_finalizer_still_cuts_the_answer_off(monkeypatch):
    """The interrupt dropped in the finalizer reaches no hook (pytest would report it as an error of a later test),
    and the next firing ends the block."""
    hook = SlowHook()
    monkeypatch.setattr(sys, "unraisablehook", hook)
    started = time.monotonic()
    with pytest.raises(GradingTimeout):
        with time_limit(0.05):
            SpinsInItsFinalizer()
            time.sleep(5)
    assert time.monotonic() - started < 2
    assert hook.given == [] and sys.unraisablehook is hook


def test_a_finalizers_own_error_reaches_the_outer_hook_whole(monkeypatch):
    """The outer hook gets the finalizer's error and runs to its end while the timer fires; the block is then cut
    off."""
    hook = SlowHook()
    monkeypatch.setattr(sys, "unraisablehook", hook)
    with pytest.raises(GradingTimeout):
        with time_limit(0.05):
            FailsInItsFinalizer()
            time.sleep(5)
    assert hook.finished == [ValueError] and sys.unraisablehook is hook


# A job's deadline in the pool tests: a trivial job takes milliseconds and reaches it only if the machine stalls for
# seconds, so every job but the hung one gets its answer however loaded the machine is
DEADLINE_S = 5.0


def _sleep_or_echo(job):
    if job == "hang":
        time.sleep(600)  # stands for a C-level call that ignores the timer signal
    if job == "die":
        import os

        os._exit(1)
    return job.upper()


def test_pool_kills_a_hung_worker_and_carries_on():
    jobs = ["a", "hang", "b", "die", "c", "d"]
    started = time.monotonic()
    out = run_with_deadline(_sleep_or_echo, jobs, workers=2, deadline_s=DEADLINE_S, on_failure=lambda job, why: why)
    assert out == ["A", "timeout", "B", "crash", "C", "D"]
    assert time.monotonic() - started < DEADLINE_S + 25  # the hung job alone would hold it 600 s


def test_pool_reraises_errors_of_the_function():
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        run_with_deadline(lambda job: 1 / job, [1, 0, 2], workers=2, deadline_s=5, on_failure=lambda j, w: None)


def test_pool_requeues_the_rest_of_a_chunk_after_a_kill():
    jobs = [f"j{i}" for i in range(100)]  # 100 jobs on 2 workers travel in chunks of 6
    jobs[8] = "hang"
    out = run_with_deadline(_sleep_or_echo, jobs, workers=2, deadline_s=DEADLINE_S, on_failure=lambda job, why: why)
    assert out == [("timeout" if job == "hang" else job.upper()) for job in jobs]
