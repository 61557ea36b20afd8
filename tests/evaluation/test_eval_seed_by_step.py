"""eval.seed_by_step: each evaluation step draws from a seed of its own, derived from (eval.seed, step), so that a
run's evaluations do not reread one random stream, and the methods of one run seed share theirs."""

from __future__ import annotations

from dataclasses import replace

from conftest import REPO, train_config
from helpers.scripted_generation import FakeTokenizer, ScriptedGenerator

import atr_grpo.evaluation
from atr_grpo.evaluation import engines, load_benchmark, read_summary
from atr_grpo.evaluation.sampling import step_seed
from atr_grpo.training import evaluations


def test_step_seeds_differ_by_step_and_seed_and_fit_a_config_seed():
    seeds = {(s, t): step_seed(s, t) for s in range(10) for t in (0, 32, 64, 96, 128)}
    assert len(set(seeds.values())) == len(seeds)
    assert all(0 <= v < 2**32 for v in seeds.values())
    assert step_seed(3, 64) == 66987337  # a change of the derivation changes every evaluation stream: say so here


def test_the_sampling_seed_follows_the_step_only_when_asked():
    fixed = train_config(["experiment=smoke", "eval.seed=7"])
    assert [engines.sampling_config(fixed.eval, step).seed for step in (0, 5)] == [7, 7]
    by_step = train_config(["experiment=smoke", "eval.seed=7", "eval.seed_by_step=true"])
    assert [engines.sampling_config(by_step.eval, step).seed for step in (0, 5)] == [step_seed(7, 0), step_seed(7, 5)]


def test_a_training_evaluation_samples_with_its_steps_seed(monkeypatch, tmp_path):
    cfg = train_config(["experiment=smoke", "seed=4", "eval.seed=${seed}", "eval.seed_by_step=true"])
    seen = []
    monkeypatch.setattr(
        atr_grpo.evaluation, "run_evaluation", lambda *args, **kw: seen.append(kw["sampling"].seed) or {}
    )
    for step in (0, 2):
        evaluations._run(cfg, object(), object(), [], tmp_path, step)
    assert seen == [step_seed(4, 0), step_seed(4, 2)]


def test_a_training_evaluations_summary_line_records_the_seed_it_drew_with(tmp_path):
    """Through the runner: the line of step 2 holds its step's seed as `drawn_seed` and the run's seed as `seed`."""
    cfg = train_config(["experiment=smoke", "seed=4", "eval.seed=${seed}", "eval.seed_by_step=true"])
    amc = load_benchmark("amc23", REPO / "tests" / "fixtures" / "eval" / "amc23.jsonl", strict=False)
    generator = ScriptedGenerator({"": [("\\boxed{84}", "stop")] * 4})
    evaluations._run(
        replace(cfg, eval=replace(cfg.eval, grader_workers=0)), generator, FakeTokenizer(), [amc], tmp_path, 2
    )
    row = read_summary(tmp_path)[(2, "amc23")]
    assert (row["drawn_seed"], row["seed"]) == (step_seed(4, 2), 4)
