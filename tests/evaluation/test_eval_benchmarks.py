"""Benchmark loading from fixture files in the three hub schemas (made-up problems), and its checks."""

import json
import sys
import types
from unittest.mock import patch

import pytest
from conftest import REPO

from atr_grpo.evaluation import BENCHMARKS, BenchmarkError, BenchmarkSpec, load_benchmark, register_benchmark
from atr_grpo.evaluation.benchmarks import content_hash, normalize_gold

FIXTURES = REPO / "tests" / "fixtures" / "eval"


def test_specs_of_the_paper_benchmarks():
    assert (BENCHMARKS["amc23"].hub_id, BENCHMARKS["amc23"].split, BENCHMARKS["amc23"].num_problems) == (
        "AI-MO/aimo-validation-amc",
        "train",
        83,
    )
    assert (BENCHMARKS["aime24"].hub_id, BENCHMARKS["aime24"].split, BENCHMARKS["aime24"].num_problems) == (
        "math-ai/aime24",
        "test",
        30,
    )
    assert (BENCHMARKS["aime25"].hub_id, BENCHMARKS["aime25"].split, BENCHMARKS["aime25"].num_problems) == (
        "math-ai/aime25",
        "test",
        30,
    )


def test_amc_float_golds_are_normalised_and_colliding_ids_fall_back_to_row_indices():
    bench = load_benchmark("amc23", FIXTURES / "amc23.jsonl", strict=False)
    assert [p.gold for p in bench.problems] == ["84", "27", "-1", "9"]
    assert [p.id for p in bench.problems] == [0, 1, 2, 3], "ids 0, 1, 0, 1 collide, so row indices are used"
    assert bench.source.startswith("file:") and len(bench.content_hash) == 64


def test_aime24_gold_comes_from_the_last_box_of_the_solution():
    bench = load_benchmark("aime24", FIXTURES / "aime24.jsonl", strict=False)
    assert [(p.id, p.gold) for p in bench.problems] == [(60, "24"), (61, "21"), (62, "32")]


def test_aime24_answer_field_wins_when_present(tmp_path):
    rows = [{"id": 1, "problem": "p", "solution": "no box here", "answer": "073"}]
    path = tmp_path / "aime24.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert load_benchmark("aime24", path, strict=False).problems[0].gold == "73"


def test_aime25_control_characters_are_repaired():
    bench = load_benchmark("aime25", FIXTURES / "aime25.jsonl", strict=False)
    first, second = bench.problems[0].problem, bench.problems[1].problem
    assert "\x0c" not in first and "\\frac{1}{2}" in first
    assert "\t" not in second and "\\triangle ABC" in second
    assert bench.problems[2].gold == "10"


def test_strict_mode_checks_the_row_count():
    with pytest.raises(BenchmarkError) as err:
        load_benchmark("amc23", FIXTURES / "amc23.jsonl")
    message = str(err.value)
    assert "'amc23'" in message and "expected 83" in message and "found 4" in message and "strict=False" in message


def test_unparsable_golds_fail_loudly_with_their_ids(tmp_path):
    rows = [
        {"id": "a", "problem": "p", "answer": "12"},
        {"id": "b", "problem": "q", "answer": "\\frac{"},
        {"id": "c", "problem": "r", "answer": "}{"},
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(BenchmarkError, match=r"2 gold answers do not parse.*'b'.*'c'"):
        load_benchmark("aime25", path, strict=False)


def test_missing_fields_are_named(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"id": 0, "question_text": "p", "answer": "1"}))
    with pytest.raises(BenchmarkError, match="lack a problem or gold"):
        load_benchmark("aime25", path, strict=False)


def test_json_and_parquet_copies_load_the_same_problems(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "aime25.jsonl").read_text().splitlines()]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    hashes = {
        load_benchmark("aime25", p, strict=False).content_hash
        for p in (FIXTURES / "aime25.jsonl", tmp_path / "a.json", tmp_path / "a.parquet")
    }
    assert len(hashes) == 1
    (tmp_path / "a.csv").write_text("problem,answer\n")
    with pytest.raises(BenchmarkError, match="unsupported"):
        load_benchmark("aime25", tmp_path / "a.csv", strict=False)


def test_content_hash_depends_on_problems_and_golds():
    bench = load_benchmark("aime24", FIXTURES / "aime24.jsonl", strict=False)
    problems = list(bench.problems)
    assert content_hash(problems) == bench.content_hash
    changed = [*problems[:-1], type(problems[-1])(problems[-1].id, problems[-1].problem, "31")]
    assert content_hash(changed) != bench.content_hash
    assert (
        load_benchmark("aime24", FIXTURES / "aime24.jsonl", max_problems=2, strict=False).content_hash
        != bench.content_hash
    )


def test_max_problems_keeps_the_first_ones():
    bench = load_benchmark("aime24", FIXTURES / "aime24.jsonl", max_problems=2, strict=False)
    assert [p.id for p in bench.problems] == [60, 61]


def test_hub_is_used_only_without_a_path(monkeypatch):
    calls = []
    rows = [{"problem": f"p{i}", "answer": str(i)} for i in range(30)]

    def fake_load_dataset(hub_id, config, split):
        calls.append((hub_id, config, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    bench = load_benchmark("aime25")
    assert calls == [("math-ai/aime25", None, "test")]
    assert bench.source == "hub:math-ai/aime25:test" and [p.id for p in bench.problems][:3] == [0, 1, 2]
    load_benchmark("aime25", FIXTURES / "aime25.jsonl", strict=False)
    assert len(calls) == 1


@patch.dict(BENCHMARKS)  # the registry gets its own entries back afterwards
def test_register_benchmark_with_a_loader():
    spec = BenchmarkSpec(name="toy", loader=lambda: [{"problem": "1+1?", "answer": 2}], num_problems=1)
    register_benchmark(spec)
    bench = load_benchmark("toy")
    assert (bench.source, bench.problems[0].gold, bench.problems[0].id) == ("loader:toy", "2", 0)
    with pytest.raises(BenchmarkError, match="already registered"):
        register_benchmark(spec)
    with pytest.raises(BenchmarkError, match="needs a hub_id or a loader"):
        register_benchmark(BenchmarkSpec(name="empty"))
    with pytest.raises(BenchmarkError, match="unknown benchmark 'nope'.*toy"):
        load_benchmark("nope")


@pytest.mark.parametrize(
    ("value", "gold"),
    [
        (27.0, "27"),
        (-1.0, "-1"),
        (3, "3"),
        ("033", "33"),
        ("27.0", "27"),
        ("0.5", "0.5"),
        (2.5, "2.5"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        (" 12 ", "12"),
    ],
)
def test_normalize_gold(value, gold):
    assert normalize_gold(value) == gold
