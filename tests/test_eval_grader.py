"""Grading: golden cases (math-verify 0.9.0), the final-box rule, truncation, timeouts and the worker pool."""

import threading
import time

import pytest

from atr_grpo.evaluation import GoldParseError, grade, grade_many, grade_sample, grade_samples, last_boxed
from atr_grpo.evaluation.grader import status_counts
from atr_grpo.evaluation.pool import run_with_deadline

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
