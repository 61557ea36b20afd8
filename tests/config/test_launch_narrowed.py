"""A plan entry that narrows the grid (`{overrides: [...], grid: {seed: [...]}}`): a check run on some seeds."""

import pytest

from atr_grpo import launch

PLAN = """
plan:
  runs:
    - [clipping=clip]
    - overrides: [clipping=clip_higher, clipping.eps_low=0.3]
      grid: {seed: [0, 2]}
  grid:
    seed: [0, 1, 2]
    trainer.learning_rate: [1e-4]
"""


def _plan(tmp_path, monkeypatch, text):
    (tmp_path / "exp.yaml").write_text(text)
    monkeypatch.setattr(launch, "EXPERIMENTS", tmp_path)
    return launch.load_plan("exp")


def test_a_narrowed_entry_runs_on_its_own_seeds_only(tmp_path, monkeypatch):
    plan = _plan(tmp_path, monkeypatch, PLAN)
    runs = plan.expand(["logger=none"])
    assert runs == [
        *(
            ["experiment=exp", "clipping=clip", f"seed={s}", "trainer.learning_rate=0.0001", "logger=none"]
            for s in "012"
        ),
        *(
            [
                "experiment=exp",
                "clipping=clip_higher",
                "clipping.eps_low=0.3",
                f"seed={s}",
                "trainer.learning_rate=0.0001",
                "logger=none",
            ]
            for s in "02"
        ),
    ]
    assert plan.sweeps() == [
        ["experiment=exp", "clipping=clip", "seed=0,1,2", "trainer.learning_rate=0.0001"],
        ["experiment=exp", "clipping=clip_higher", "clipping.eps_low=0.3", "seed=0,2", "trainer.learning_rate=0.0001"],
    ]


@pytest.mark.parametrize(
    "entry, needle",
    [
        (
            "{overrides: [clipping=atr], grid: {seed: [5]}}",
            "plan.runs[0].grid.seed: ['5']; allowed: among plan.grid.seed",
        ),
        ("{overrides: [clipping=atr], grid: {lr: [1]}}", "plan.runs[0].grid.lr: not a key of plan.grid (seed)"),
        ("{overrides: [clipping=atr], grid: {seed: []}}", "plan.runs[0].grid.seed: no values"),
        ("{grid: {seed: [0]}}", "plan.runs[0] must be a list of overrides or a mapping with overrides"),
        ("{overrides: [clipping=atr], seeds: [0]}", "plan.runs[0] must be a list of overrides or a mapping"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(tmp_path, monkeypatch, entry, needle):
    with pytest.raises(launch.PlanError) as err:
        _plan(tmp_path, monkeypatch, f"plan:\n  runs:\n    - {entry}\n  grid:\n    seed: [0, 1]\n")
    assert needle in str(err.value)


def test_power2_runs_the_identity_check_at_atrs_exact_box_on_three_seeds():
    from atr_grpo.clipping.bounds import kl3_ratio_bounds

    runs = launch.load_plan("power2").expand()
    low, high = kl3_ratio_bounds(0.07)
    identity = [r for r in runs if f"clipping.eps_low={1.0 - low!r}" in r and f"clipping.eps_high={high - 1.0!r}" in r]
    assert len(runs) == 5 * 10 + 3
    assert [r[-1] for r in identity] == ["seed=0", "seed=1", "seed=2"]
