"""`results diverge`: where two runs expected to be one run part (the ATR identity check of the power experiment),
and the exact box that makes clip_higher that run: `${atr_kl3_eps_low:δ}` / `${atr_kl3_eps_high:δ}`."""

from __future__ import annotations

import gzip
import json

import torch
from conftest import train_config
from helpers.run_trees import evals_of, make_run

from atr_grpo.clipping import build_rule, kl3_ratio_bounds
from atr_grpo.reporting.analyses.divergence import divergence
from atr_grpo.reporting.runs import load_run
from atr_grpo.results import main as results_main
from atr_grpo.rundir.records import Done, write_done

EVALS = evals_of({0: (0.1, 0.1, 0.1), 50: (0.2, 0.3, 0.4)})


def _samples(path, step, texts):
    folder = path / "eval" / f"step_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"problem_id": i, "sample": 0, "completion": t, "correct": False} for i, t in enumerate(texts)]
    with gzip.open(folder / "amc23.jsonl.gz", "wt") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows)


def _pair(tmp_path, evals_b=EVALS):
    a = make_run(tmp_path / "a", "power2", "tiny", "atr", {"name": "atr"}, 0, EVALS, max_steps=4)
    b = make_run(tmp_path / "b", "power2", "tiny", "clip_higher", {"name": "clip_higher"}, 0, evals_b, max_steps=4)
    return a, b


def test_identical_runs_are_reported_identical(tmp_path, capsys):
    a, b = _pair(tmp_path)
    for path in (a, b):
        _samples(path, 50, ["1 + 1 = 2.", "3 - 1 = 2."])
    assert divergence(load_run(a), load_run(b)).identical
    assert results_main(["diverge", str(a), str(b)]) == 0
    assert "identical: every shared training metric" in capsys.readouterr().out


def test_the_first_step_metric_and_sample_where_runs_part(tmp_path, capsys):
    a, b = _pair(tmp_path, evals_of({0: (0.1, 0.1, 0.1), 50: (0.25, 0.3, 0.4)}))
    rows = [json.loads(line) for line in (b / "metrics.jsonl").read_text().splitlines()]
    rows[2]["clip/frac"] = 0.0125  # step 3
    (b / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _samples(a, 50, ["1 + 1 = 2.", "3 - 1 = 2."])
    _samples(b, 50, ["1 + 1 = 2.", "3 - 1 = 4."])
    found = divergence(load_run(a), load_run(b))
    assert found.first_training_step == 3 and found.first_training_metrics == ["clip/frac"]
    assert found.largest["train/clip/frac"] == 0.0125 - 0.01
    assert found.first_evaluation == (50, "amc23")
    assert found.first_sample == {"problem_id": 1, "sample": 0, "offset": 8, "a": "2.", "b": "4."}
    assert abs(found.largest["eval/amc23/mean@8"] - 0.05) < 1e-12 and found.largest["eval/aime25/mean@8"] == 0
    assert results_main(["diverge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "training parts at optimizer step 3 (clip/frac)" in out and "problem 1, sample 0, from character 8" in out


def test_evaluations_that_agree_are_named_identical_and_left_out_of_the_table(tmp_path, capsys):
    """Training parts, evaluations do not: one line says so, and only the metrics that differ are listed."""
    a, b = _pair(tmp_path)
    rows = [json.loads(line) for line in (b / "metrics.jsonl").read_text().splitlines()]
    (b / "metrics.jsonl").write_text("".join(json.dumps(r | {"clip/frac": 0.02}) + "\n" for r in rows))
    for path in (a, b):
        _samples(path, 50, ["1 + 1 = 2.", "3 - 1 = 2."])
    assert results_main(["diverge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "evaluations: identical (steps 0, 50)" in out
    assert out.splitlines()[-3:] == ["| metric | largest abs. difference |", "|---|---:|", "| train/clip/frac | 0.01 |"]


def test_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys):
    assert results_main(["diverge", str(tmp_path), str(tmp_path)]) == 2
    assert f"{tmp_path} is not a run directory" in capsys.readouterr().err


def test_the_resolvers_give_atrs_exact_box_and_clip_higher_then_trains_as_atr():
    cfg = train_config(
        [
            "clipping=clip_higher",
            "clipping.eps_low=${atr_kl3_eps_low:0.07}",
            "clipping.eps_high=${atr_kl3_eps_high:0.07}",
        ]
    )
    low, high = kl3_ratio_bounds(0.07)
    assert (cfg.clipping.eps_low, cfg.clipping.eps_high) == (1 - low, high - 1)
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(16, 32, generator=g, dtype=torch.float64) * 3
    old = logp + 0.4 * torch.randn(16, 32, generator=g, dtype=torch.float64)
    advantages, mask = torch.randn(16, generator=g, dtype=torch.float64), torch.rand(16, 32, generator=g) > 0.1
    grads = []
    for rule in (build_rule("atr", delta=0.07), build_rule("clip_higher", eps_low=1 - low, eps_high=high - 1)):
        leaf = logp.clone().requires_grad_()
        rule(leaf, old, advantages, mask).loss.sum().backward()
        grads.append(leaf.grad)
    frozen = grads[0] == 0
    assert 0.05 < float(frozen[mask].double().mean()) < 0.95  # the box binds on many tokens
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-15)


def test_a_run_cut_off_is_not_identical_to_the_whole_run(tmp_path, capsys):
    a = make_run(tmp_path / "a", "power2", "tiny", "atr", {"name": "atr"}, 0, EVALS, max_steps=128)
    cut = evals_of({0: (0.1, 0.1, 0.1)})  # the copy stopped at step 96, before the step-50 evaluation was kept
    b = make_run(tmp_path / "b", "power2", "tiny", "clip_higher", {"name": "clip_higher"}, 0, cut, max_steps=96)
    write_done(a, Done(step=128, seconds=10.0))
    found = divergence(load_run(a), load_run(b))
    assert not found.identical
    assert found.unequal == [
        "training steps only in A: 97, 98, 99, …, 128 (32)",
        "evaluations only in A: step 50 aime24, step 50 aime25, step 50 amc23 (3)",
        "DONE: A has DONE at step 128, B has no DONE",
    ]
    assert results_main(["diverge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "identical:" not in out and "unequal lengths: training steps only in A: 97" in out
    assert "the evaluations both runs have: identical (step 0)" in out


def _seeded(path, run_seed, drawn_seed=None):
    """Give every summary line of `path` the run's seed as `seed` and, unless None, `drawn_seed`."""
    summary = path / "eval" / "summary.jsonl"
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    drawn = {} if drawn_seed is None else {"drawn_seed": drawn_seed}
    summary.write_text("".join(json.dumps(row | {"seed": run_seed} | drawn) + "\n" for row in rows))


def test_byte_identical_samples_never_part_whatever_the_runs_own_seeds(tmp_path, capsys):
    """Two seeds' runs drew step 0 with eval.seed 0 (shared samples): the lines' `seed` (the run's) differs, the
    samples do not, so no evaluation parts there."""
    a, b = _pair(tmp_path)
    for path, seed in ((a, 0), (b, 1)):
        _samples(path, 0, ["1 + 1 = 2.", "3 - 1 = 2."])
        _samples(path, 50, ["1 + 1 = 2.", "3 - 1 = 2."])
        _seeded(path, seed, drawn_seed=0)
    found = divergence(load_run(a), load_run(b))
    assert found.first_evaluation is None and found.seed_notes == []
    assert not any(key.endswith("/seed") for key in found.largest)
    assert results_main(["diverge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "identical: every shared training metric" in out and "evaluation parts" not in out


def test_other_drawn_seeds_are_named_and_older_lines_say_where_their_seed_came_from(tmp_path, capsys):
    a, b = _pair(tmp_path)
    _seeded(a, 0, drawn_seed=0)
    _seeded(b, 5, drawn_seed=None)  # an older run: config.yaml has no eval.seed, so the line's seed stands in
    assert results_main(["diverge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "note: drawn seed differs at step 0, amc23: A 0, B 5" in out
    assert (
        "note: B: written before summary lines recorded drawn_seed: its drawn seed is taken from config.yaml's "
        "eval.seed (with eval.seed_by_step, its step's seed), else from the line's seed"
    ) in out
