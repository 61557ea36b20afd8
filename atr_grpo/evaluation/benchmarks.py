"""Evaluation benchmarks: a loader that checks what it loads, for the specs of `atr_grpo.benchmarks`.

    spec = BenchmarkSpec(name="mine", loader=lambda: [{"id": 0, "problem": "1+1?", "answer": "2"}])
    register_benchmark(spec)
    bench = load_benchmark("mine")            # or load_benchmark("amc23", path="amc.jsonl")

Rows come from, in this order of preference: a local file given as `path` (.jsonl, .json or
.parquet), the spec's `loader` callable, or the hub (`datasets.load_dataset`, only then imported).
Each row becomes a `Problem(id, problem, gold)`:
- id: the row's `id_field` when every row has one and they are unique, else the row index;
- problem: the first present `problem_fields`, passed through the spec's `repair` (aime25's control
  characters);
- gold: the first present `answer_fields`, else the content of the last `\\boxed{}` in one of the
  `boxed_answer_fields` (aime24's `solution`); integer-valued golds are normalised ("27.0" → "27",
  "033" → "33").
The loader then checks the row count against `num_problems` (strict mode) and that every gold parses
with math-verify, and records the source and a content hash (sha256 over the normalised
(id, problem, gold) list of the problems evaluated).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atr_grpo.benchmarks import BENCHMARKS, BenchmarkError, BenchmarkSpec, Row, register_benchmark
from atr_grpo.benchmarks.arithmetic import arithmetic_benchmark
from atr_grpo.data.arithmetic import task_settings
from atr_grpo.evaluation.gold import GoldParseError, parse_gold
from atr_grpo.evaluation.grader import last_boxed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    id: int | str
    problem: str
    gold: str


@dataclass(frozen=True)
class Benchmark:
    name: str
    problems: list[Problem] = field(repr=False)
    source: str
    content_hash: str

    def __len__(self) -> int:
        return len(self.problems)


# ------------------------------------------------------------------------------------------ reading
def read_rows(path: str | Path) -> list[Row]:
    """Rows of a local .jsonl, .json (a list, or {"data"|"rows"|"train"|"test": list}) or .parquet file."""
    path = Path(path)
    if not path.exists():
        raise BenchmarkError(f"benchmark file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            data = next((data[k] for k in ("data", "rows", "train", "test") if isinstance(data.get(k), list)), None)
        if not isinstance(data, list):
            raise BenchmarkError(f"{path}: expected a JSON list of rows")
        return data
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise BenchmarkError(f"{path}: unsupported benchmark file type {suffix!r} (use .jsonl, .json or .parquet)")


def _hub_rows(spec: BenchmarkSpec) -> list[Row]:
    from datasets import load_dataset

    try:
        dataset = load_dataset(spec.hub_id, spec.hub_config, split=spec.split)
    except OSError as err:  # offline, the hub unreachable, no such dataset (requests' errors are OSErrors too)
        reason = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise BenchmarkError(
            f"benchmark {spec.name!r}: cannot load {spec.hub_id} from the hub ({reason}); connect to the hub once "
            f"to cache it, or give a local copy with eval.paths.{spec.name}=FILE"
        ) from None
    return [dict(row) for row in dataset]


_INTEGER = re.compile(r"^[+-]?\d+(\.0*)?$")


def normalize_gold(value: Any) -> str:
    """The gold as a string; integer-valued numbers lose padding and decimals (27.0 → "27", "033" → "33")."""
    if isinstance(value, bool) or value is None:
        raise BenchmarkError(f"gold answer {value!r} is not a number or a string")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    text = str(value).strip()
    if _INTEGER.match(text):
        return str(int(float(text))) if "." in text else str(int(text))
    return text


def _gold_of(spec: BenchmarkSpec, row: Row) -> Any:
    for key in spec.answer_fields:
        if row.get(key) is not None and str(row[key]).strip() != "":
            return row[key]
    for key in spec.boxed_answer_fields:
        if row.get(key) is not None:
            boxed = last_boxed(str(row[key]))
            if boxed is not None:
                return boxed
    return None


def _problem_ids(spec: BenchmarkSpec, rows: list[Row]) -> list[int | str]:
    """The dataset's ids when every row has one and they are unique, else the row indices.

    (Some copies of the AMC set restart their ids per contest, so ids alone would collide.)
    """
    raw = [row.get(spec.id_field) for row in rows]
    ids = [r if isinstance(r, (int, str)) and not isinstance(r, bool) else str(r) for r in raw]
    if any(r is None for r in raw) or len(set(ids)) != len(ids):
        if any(r is not None for r in raw):
            log.info("benchmark %r: ids missing or not unique; using row indices", spec.name)
        return list(range(len(rows)))
    return ids


def to_problems(spec: BenchmarkSpec, rows: list[Row]) -> list[Problem]:
    problems, missing = [], []
    for problem_id, row in zip(_problem_ids(spec, rows), rows):
        text = next((row[key] for key in spec.problem_fields if row.get(key) is not None), None)
        gold = _gold_of(spec, row)
        if text is None or gold is None:
            missing.append(problem_id)
            continue
        text = spec.repair(str(text)) if spec.repair else str(text)
        problems.append(Problem(problem_id, text, normalize_gold(gold)))
    if missing:
        fields = [*spec.problem_fields, *spec.answer_fields, *spec.boxed_answer_fields]
        raise BenchmarkError(
            f"benchmark {spec.name!r}: rows {missing[:20]} lack a problem or gold answer (fields tried: {fields})"
        )
    return problems


def content_hash(problems: list[Problem]) -> str:
    payload = json.dumps([[p.id, p.problem, p.gold] for p in problems], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def check_golds(name: str, problems: list[Problem]) -> None:
    """Every gold must parse with math-verify: otherwise every sample of that problem would score 0."""
    bad = []
    for problem in problems:
        try:
            parse_gold(problem.gold)
        except GoldParseError:
            bad.append((problem.id, problem.gold))
    if bad:
        raise BenchmarkError(f"benchmark {name!r}: {len(bad)} gold answers do not parse with math-verify: {bad[:20]}")


def load_benchmark(
    name: str, path: str | Path | None = None, max_problems: int | None = None, strict: bool = True
) -> Benchmark:
    """Load, check and fingerprint one registered benchmark (see the module docstring)."""
    if name not in BENCHMARKS:
        raise BenchmarkError(f"unknown benchmark {name!r}; registered: {', '.join(sorted(BENCHMARKS))}")
    spec = BENCHMARKS[name]
    if path is not None:
        rows, source = read_rows(path), f"file:{Path(path).resolve()}"
    elif spec.loader is not None:
        rows, source = [dict(row) for row in spec.loader()], f"loader:{name}"
    else:
        rows = _hub_rows(spec)
        source = f"hub:{spec.hub_id}" + (f"/{spec.hub_config}" if spec.hub_config else "") + f":{spec.split}"
    if strict and spec.num_problems is not None and len(rows) != spec.num_problems:
        raise BenchmarkError(
            f"benchmark {name!r}: expected {spec.num_problems} problems, found {len(rows)} in {source}. "
            "If this is intended (a subset or another version), load with strict=False (eval.strict=false)."
        )
    problems = to_problems(spec, rows)
    if max_problems is not None:
        problems = problems[:max_problems]
    check_golds(name, problems)
    return Benchmark(name=name, problems=problems, source=source, content_hash=content_hash(problems))


def register_task_benchmark(data: Any) -> None:
    """Make `arithmetic` the held-out problems of a training run's synthetic task (`data`, a DataConfig), replacing
    the default task's."""
    spec = arithmetic_benchmark(*task_settings(data))
    register_benchmark(spec, replace=True)
