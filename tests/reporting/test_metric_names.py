"""A metric name has one parser, `reporting.metric`: what it accepts, what it refuses, and that no other
reporting module spells a name from K by hand."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from atr_grpo.reporting.metric import EXPECTED, Metric, MetricError, defaults, parts


@pytest.mark.parametrize(
    "name", ["mean@8", "pass@1", "mean@16", "pass@128", "answered@8", "acc_given_answer@8", "truncated@4"]
)
def test_a_parsed_name_prints_back_as_itself(name):
    assert str(Metric.parse(name)) == name and Metric.is_name(name)


def test_parse_splits_the_kind_from_k():
    assert Metric.parse("pass@8") == Metric("pass", 8)


@pytest.mark.parametrize("name", ["mean8", "mean@0", "mean@08", "avg@8", "mean@", "@8", "Mean@8", 8, None])
def test_anything_but_mean_or_pass_at_a_positive_k_is_refused_with_the_expected_shape(name):
    assert not Metric.is_name(name)
    with pytest.raises(MetricError, match=re.escape(f"expected {EXPECTED}")):
        Metric.parse(name)


def test_only_the_accuracy_given_an_answer_is_a_ratio_and_the_parts_are_read_from_statuses():
    assert [Metric.parse(name).is_ratio for name in parts(8)] == [False, True, False]
    assert all(Metric.parse(name).is_part for name in parts(8)) and not Metric.parse("mean@8").is_part


@pytest.mark.parametrize("k", [1, 4, 8])
def test_the_default_metrics_are_mean_then_pass_at_the_runs_k(k):
    assert [Metric.parse(name) for name in defaults(k)] == [Metric("mean", k), Metric("pass", k)]


def test_no_other_reporting_module_builds_or_splits_a_metric_name():
    spelled = re.compile(r'f"(mean|pass)@\{|\.split\("@"\)|\.partition\("@"\)|\(mean\|pass\)@')
    offenders = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "atr_grpo" / "reporting").rglob("*.py"))
        if path.name != "metric.py" and spelled.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
