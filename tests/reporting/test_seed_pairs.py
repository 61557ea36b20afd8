"""Seed pairing has one owner, `reporting.cells`: a run of A meets B's run of the same seed, whatever order
either side lists its runs in, and a cell's row of a seed is found the same way."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from atr_grpo.reporting.cells import Scores, seed_pairs


def _runs(method: str, seeds: list[int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(method=method, seed=seed) for seed in seeds]


def test_each_run_of_a_meets_the_run_of_b_with_its_seed_in_seed_order():
    pairs = seed_pairs(_runs("a", [3, 1, 2]), _runs("b", [2, 3, 1]))
    assert [(a.seed, b.seed) for a, b in pairs] == [(1, 1), (2, 2), (3, 3)]
    assert {a.method for a, _ in pairs} == {"a"} and {b.method for _, b in pairs} == {"b"}


def test_a_seed_only_one_side_ran_is_left_out():
    assert [a.seed for a, _ in seed_pairs(_runs("a", [1, 2, 4]), _runs("b", [4, 1, 5]))] == [1, 4]


def test_a_cell_gives_the_row_of_each_seed_in_the_order_asked():
    scores = Scores(seeds=[5, 1, 3], problems={"b": ["0"]}, values={"b": np.zeros((3, 1))}, steps=[(1,)] * 3)
    assert scores.rows([1, 3, 5]) == [1, 2, 0]
