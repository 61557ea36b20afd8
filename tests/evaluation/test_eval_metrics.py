"""Mean@K and Pass@K against brute force on toy score matrices."""

import itertools
import math
import random

import pytest

from atr_grpo.evaluation import mean_at_k, pass_at_k, summarize
from atr_grpo.evaluation.metrics import average


def brute_pass_at_k(row, k):
    """The fraction of size-k subsets of the samples that hold at least one correct sample."""
    subsets = list(itertools.combinations(row, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_average_over_all_size_k_subsets(n):
    for c in range(n + 1):
        row = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(row, k), abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_n_is_any_correct_and_pass_at_1_is_the_mean():
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


def test_pass_at_k_is_stable_for_large_n():
    value = pass_at_k(1024, 3, 128)
    assert value == pytest.approx(1 - math.comb(1021, 128) / math.comb(1024, 128), rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_at_k_is_the_mean_over_problems_and_samples():
    matrix = [[True, False, False, False], [True, True, True, True], [False] * 4]
    assert mean_at_k(matrix) == pytest.approx(5 / 12)
    with pytest.raises(ValueError, match="same number"):
        mean_at_k([[True, False], [True]])  # a short row would bias every metric
    with pytest.raises(ValueError):
        mean_at_k([])


def test_summarize_matches_brute_force_for_every_k():
    rng = random.Random(0)
    matrix = [[rng.random() < p for _ in range(6)] for p in (0.0, 0.1, 0.5, 0.9, 1.0)]
    summary = summarize(matrix)
    assert sorted(summary) == sorted([f"mean@{k}" for k in range(1, 7)] + [f"pass@{k}" for k in range(1, 7)])
    for k in range(1, 7):
        assert summary[f"pass@{k}"] == pytest.approx(sum(brute_pass_at_k(r, k) for r in matrix) / len(matrix))
        assert summary[f"mean@{k}"] == pytest.approx(sum(sum(r[:k]) / k for r in matrix) / len(matrix))
    assert summary["mean@6"] == pytest.approx(mean_at_k(matrix))
    assert summary["pass@6"] == pytest.approx(sum(any(r) for r in matrix) / len(matrix))
    assert summary["pass@1"] == pytest.approx(summary["mean@6"])
    with pytest.raises(ValueError, match="outside"):
        summarize(matrix, ks=[7])


def test_average_is_the_plain_mean_of_benchmarks():
    """The paper's Average: each benchmark weighs the same, whatever its number of problems."""
    amc = summarize([[True] * 2] * 83)
    aime = summarize([[False] * 2] * 30)
    assert average([amc, aime])["mean@2"] == pytest.approx(0.5)
    assert average([]) == {}
