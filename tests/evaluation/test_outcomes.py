"""The answered rate, the accuracy given an answer and the truncated share, on hand-built samples."""

import math

import pytest

from atr_grpo.evaluation.metrics import summarize
from atr_grpo.evaluation.outcomes import outcome_parts, split_gain

# 3 problems × 4 samples: 12 samples, 7 answered (5 correct, 1 wrong, 1 timeout), 3 without a box, 2 truncated
STATUSES = [
    ["correct", "correct", "no_answer", "truncated"],
    ["wrong", "correct", "timeout", "no_answer"],
    ["correct", "correct", "no_answer", "truncated"],
]


def test_the_parts_count_answered_correct_and_truncated_samples():
    parts = outcome_parts(STATUSES, ks=[4])
    assert parts["answered@4"] == pytest.approx(7 / 12)
    assert parts["acc_given_answer@4"] == pytest.approx(5 / 7)
    assert parts["truncated@4"] == pytest.approx(2 / 12)


def test_mean_at_k_is_the_answered_rate_times_the_accuracy_given_an_answer():
    correct = [[status == "correct" for status in row] for row in STATUSES]
    for k in (1, 2, 3, 4):
        parts = outcome_parts(STATUSES, ks=[k])
        mean = summarize(correct, ks=[k])[f"mean@{k}"]
        assert parts[f"answered@{k}"] * parts[f"acc_given_answer@{k}"] == pytest.approx(mean)


def test_the_first_k_samples_only():
    parts = outcome_parts(STATUSES, ks=[2])
    assert parts["answered@2"] == 1.0  # the first two samples of each problem all hold a final box
    assert parts["acc_given_answer@2"] == pytest.approx(5 / 6)
    assert parts["truncated@2"] == 0.0


def test_standard_errors_are_over_problems():
    parts = outcome_parts(STATUSES, ks=[4])
    answered = [2 / 4, 3 / 4, 2 / 4]  # each problem's answered rate
    mean = sum(answered) / 3
    sd = math.sqrt(sum((a - mean) ** 2 for a in answered) / 2)
    assert parts["answered@4_stderr"] == pytest.approx(sd / math.sqrt(3))
    # the ratio's delta-method SE: problems (c, a) = (2, 2), (1, 3), (2, 2); R = 5/7
    ratio = 5 / 7
    residuals = [2 - ratio * 2, 1 - ratio * 3, 2 - ratio * 2]
    expected = math.sqrt(sum(r * r for r in residuals) / (3 * 2)) / (7 / 3)
    assert parts["acc_given_answer@4_stderr"] == pytest.approx(expected)


def test_no_answer_leaves_the_accuracy_given_an_answer_undefined():
    parts = outcome_parts([["no_answer", "truncated"], ["no_answer", "no_answer"]], ks=[2])
    assert parts["answered@2"] == 0.0
    assert parts["acc_given_answer@2"] is None
    assert parts["acc_given_answer@2_stderr"] is None


def test_one_problem_has_no_standard_error():
    parts = outcome_parts([["correct", "wrong"]], ks=[2])
    assert parts["answered@2_stderr"] is None and parts["acc_given_answer@2_stderr"] is None


def test_unequal_rows_and_k_out_of_range_are_errors():
    with pytest.raises(ValueError, match="same number"):
        outcome_parts([["correct"], ["correct", "wrong"]], ks=[1])
    with pytest.raises(ValueError, match="outside"):
        outcome_parts(STATUSES, ks=[5])


def test_a_gain_splits_into_the_answered_rate_and_the_accuracy_in_both_orders():
    # power2's shape: the answered rate 0.516 -> 0.70, the accuracy given an answer 0.589 -> 0.607
    split = split_gain(0.516, 0.589, 0.70, 0.607)
    assert split.change == pytest.approx(0.70 * 0.607 - 0.516 * 0.589)
    assert sum(split.answered_first) == pytest.approx(split.change)
    assert sum(split.accuracy_first) == pytest.approx(split.change)
    assert split.answered_first == pytest.approx(((0.70 - 0.516) * 0.589, 0.70 * (0.607 - 0.589)))
    first, last = split.answered_shares
    assert first == pytest.approx(0.184 * 0.589 / split.change)
    assert last == pytest.approx(0.184 * 0.607 / split.change)
    assert 0.85 < first < last < 0.95  # most of this gain is the answered rate, in either order


def test_no_change_has_no_shares():
    assert split_gain(0.5, 0.5, 0.5, 0.5).answered_shares is None
