"""The design gates of an analysis plan (`analyses/gates.py`): validity (distinct evaluation streams by construction
and a cross-seed residual correlation within its bound) and precision (every planned comparison's sign-flip MDE at
its own level within a share of the margin), on simulated run trees; the `gates` key and the dated amendment."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from helpers.run_trees import read_csv
from helpers.sampled_runs import PROBLEMS, SAMPLES, sampled_run
from omegaconf import OmegaConf
from test_analysis_plan import PLAN, commit_all, git, run_cli, write_plan

from atr_grpo.reporting import plan, stats
from atr_grpo.reporting.analyses import gates
from atr_grpo.rundir import layout

SEEDS = PLAN["seeds"]
GATES = {"max_residual_correlation": 0.05, "max_mde_share_of_margin": 0.5}
AMENDMENT = {"amends": "plan.yaml", "date": "2026-12-05", "deviation": "the gates are restated", "gates": GATES}


# ------------------------------------------------------------------------------------------ the laws
def test_the_sign_flip_mde_factor_gives_the_test_80_percent_power():
    """At factor × σ, the exact sign-flip test at α over 10 normal differences rejects 80 % of the time (checked on
    a stream the factor did not use); its factor exceeds the paired t's at α/4, and is nan when 2^(1−S) ≥ α."""
    factor = gates.sign_flip_mde_factor(10, 0.0125)
    t_factor = float(stats.minimum_detectable_effect(1.0, 10, 0.0125))
    assert 1.0 < factor / t_factor < 1.1
    differences = np.random.default_rng(12345).standard_normal((4000, 10)) + factor
    p = stats.seed_sign_flip_pvalue(differences, stats.Resampling(), "law")
    assert np.mean(p < 0.0125) == pytest.approx(0.8, abs=0.025)
    assert np.isnan(gates.sign_flip_mde_factor(5, 0.05))  # 2/32 = 0.0625 ≥ 0.05: it can never reject


def test_the_noise_share_has_its_chi_square_interval():
    """σ_e 0.251, SD_d 0.348, 10 seeds (power2's primary): 52 % [16 %, 100 %], the interval capped at 1."""
    share, low, high = gates.noise_share_interval(0.251, 0.348, 10)
    assert (round(share, 2), round(low, 2), high) == (0.52, 0.16, 1.0)
    assert gates.noise_share_interval(0.222, 0.213, 10)[0] > 1  # the point is not capped


# ------------------------------------------------------------------------------------------ simulated trees
def _verdicts(uniforms: np.ndarray, chance: np.ndarray) -> list[list[bool]]:
    return (uniforms < chance[:, None]).tolist()


def _tree(root, shared_draws: bool, eval_seeds):
    """Runs of atr, clip and clip_higher × 6 seeds at step 100 on 3 benchmarks. Each problem's chance of success
    depends on the seed and method; the samples read uniforms of their seed's own, or one draw every seed shares.
    atr is 0.1 above clip, clip_higher 0.02 above it."""
    problems = np.random.default_rng(7).uniform(0.1, 0.9, PROBLEMS)
    shared = np.random.default_rng(99).uniform(size=(3, PROBLEMS, SAMPLES))
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        own = shared if shared_draws else rng.uniform(size=(3, PROBLEMS, SAMPLES))
        start = np.clip(problems + rng.normal(0, 0.05, PROBLEMS), 0.02, 0.98)
        for method, lift in (("clip", 0.0), ("clip_higher", 0.02), ("atr", 0.1)):
            chance = np.clip(start + lift, 0, 1)
            matrices = {100: {b: _verdicts(own[i], chance) for i, b in enumerate(("amc23", "aime24", "aime25"))}}
            path = sampled_run(root / "runs", "trial", method, seed, matrices)
            config = OmegaConf.load(layout.config_path(path))
            if eval_seeds is not None:
                config.eval.seed, config.eval.seed_by_step = eval_seeds(seed), True
            OmegaConf.save(config, layout.config_path(path))
            (path / "env.json").write_text(json.dumps({"git_commit": "0" * 40}))


def _experiment(root, shared_draws=False, eval_seeds=lambda seed: seed, margin=1.0, amended=True):
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    changes = {"secondary": [["clip_higher", "clip"]], "equivalence_margin": margin, "benchmark": "average"}
    write_plan(root / "plan.yaml", **changes)
    if amended:
        (root / "plan_amendment_2026-12-05.yaml").write_text(yaml.safe_dump(AMENDMENT))
    commit_all(root, "plan")
    _tree(root, shared_draws, eval_seeds)
    return root


def _check(root):
    the_plan = plan.load_plan(root / "plan.yaml")
    from atr_grpo.reporting.analyses import planned
    from atr_grpo.reporting.runs import find_runs

    runs = find_runs(root / "runs")
    return gates.check(runs, the_plan, planned.analyse(runs, the_plan, stats.Resampling(200))), the_plan


def test_independent_streams_pass_validity_and_a_wide_margin_passes_precision(tmp_path):
    result, the_plan = _check(_experiment(tmp_path))
    (validity,) = result.validity.values()
    assert validity.streams_distinct and abs(validity.correlation) < 0.05 and validity.passes
    assert validity.pairs == 3 * 15  # every planned method × 15 seed pairs × 1 step
    for p in result.precision:
        assert p.mde == pytest.approx(gates.sign_flip_mde_factor(6, p.level) * p.sd)
        assert p.limit == 0.5 and p.passes == (p.mde <= 0.5)
    assert the_plan.amendments[0].date == "2026-12-05"


def test_one_draw_shared_by_the_seeds_fails_validity_even_when_the_configs_say_otherwise(tmp_path):
    result, _ = _check(_experiment(tmp_path, shared_draws=True))
    (validity,) = result.validity.values()
    assert validity.streams_distinct and validity.correlation > 0.3 and not validity.passes


def test_one_evaluation_seed_for_every_seed_fails_by_construction(tmp_path):
    result, _ = _check(_experiment(tmp_path, eval_seeds=lambda seed: 0))
    (validity,) = result.validity.values()
    assert not validity.streams_distinct and "read overlapping evaluation streams" in validity.streams_note
    assert not validity.passes


def test_a_config_without_an_evaluation_seed_cannot_pass(tmp_path):
    result, _ = _check(_experiment(tmp_path, eval_seeds=None))
    (validity,) = result.validity.values()
    assert not validity.passes and "records no eval.seed" in validity.streams_note


def test_a_narrow_margin_fails_precision(tmp_path):
    result, _ = _check(_experiment(tmp_path, margin=0.01))
    assert result.precision and not any(p.passes for p in result.precision)
    assert not result.passes(next(iter(result.validity)))


# ------------------------------------------------------------------------------------------ the commands
def test_compare_prints_the_amendment_and_the_gates_and_results_all_writes_them(tmp_path):
    root = _experiment(tmp_path / "experiment")
    code, printed, _ = run_cli("compare", "atr", "clip", "--runs", root / "runs", "--resamples", 200)
    assert code == 0
    assert "## Design gates" in printed and "amendment plan_amendment_2026-12-05.yaml (dated 2026-12-05)" in printed
    assert "- validity passes:" in printed and "| clip_higher − clip | 0.05 |" in printed
    code, _, err = run_cli("all", "--runs", root / "runs", "--out", tmp_path / "tables", "--resamples", 200)
    assert code == 0 and "gates: qwen3-1.7b: " in err and "applies: the gates are restated" in err
    rows = read_csv(tmp_path / "tables" / "gates.csv")
    assert [r["gate"] for r in rows] == ["validity", "precision", "precision"]


def test_a_plan_without_gates_prints_none(tmp_path):
    root = _experiment(tmp_path / "experiment", amended=False)
    code, printed, _ = run_cli("compare", "atr", "clip", "--runs", root / "runs", "--resamples", 200)
    assert code == 0 and "## Design gates" not in printed


# ------------------------------------------------------------------------------------------ the plan file
def test_the_gates_key_is_read_and_checked(tmp_path):
    assert plan.load_plan(write_plan(tmp_path / "plan.yaml", gates=GATES)).gates == plan.Gates(0.05, 0.5)
    with pytest.raises(plan.PlanError, match=r"gates.max_residual_correlation is 2; allowed: a number in \(0, 1\)"):
        plan.load_plan(write_plan(tmp_path / "plan.yaml", gates={**GATES, "max_residual_correlation": 2}))
    with pytest.raises(plan.PlanError, match="gates is .*; allowed: exactly the keys max_residual_correlation"):
        plan.load_plan(write_plan(tmp_path / "plan.yaml", gates={"mde": 0.5}))


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("plan_amendment_2026-12-05.yaml", {"date": "2026-12-06"}, "date is '2026-12-06'; allowed: the date in"),
        ("plan_amendment_2026-12-05.yaml", {"alpha": 0.1}, "allowed: exactly amends, date, deviation, gates"),
        ("plan_amendment_2026-12-05.yaml", {"amends": "other.yaml"}, "amends is 'other.yaml'; allowed: the plan"),
        ("plan_amendment_2026-12-05.yaml", {"deviation": " "}, "deviation is ' '; allowed: what the amendment"),
        ("plan_amendment_soon.yaml", {}, "an amendment is named plan_amendment_YYYY-MM-DD.yaml"),
    ],
)
def test_a_bad_amendment_names_what_is_wrong(tmp_path, name, changes, message):
    write_plan(tmp_path / "plan.yaml")
    (tmp_path / name).write_text(yaml.safe_dump({**AMENDMENT, **changes}))
    with pytest.raises(plan.PlanError, match=message):
        plan.load_plan(tmp_path / "plan.yaml")


def test_the_last_amendment_restates_the_plans_gates(tmp_path):
    write_plan(tmp_path / "plan.yaml", gates={**GATES, "max_mde_share_of_margin": 1.0})
    (tmp_path / "plan_amendment_2026-12-05.yaml").write_text(yaml.safe_dump(AMENDMENT))
    later = {**AMENDMENT, "date": "2026-12-07", "gates": {**GATES, "max_residual_correlation": 0.1}}
    (tmp_path / "plan_amendment_2026-12-07.yaml").write_text(yaml.safe_dump(later))
    loaded = plan.load_plan(tmp_path / "plan.yaml")
    assert [a.date for a in loaded.amendments] == ["2026-12-05", "2026-12-07"]
    assert loaded.gates == plan.Gates(0.1, 0.5)
