"""power2's config holds the design its docs and analysis plan promise (docs/cpu-experiments.md, power2)."""

from pathlib import Path

from atr_grpo import launch, rundir
from atr_grpo.reporting import plan
from tests.conftest import compose, train_config

REPO = Path(__file__).resolve().parents[2]


def test_each_seed_has_its_own_start_point_and_evaluation_draws():
    a, b = (train_config(["experiment=power2", "clipping=atr", f"seed={s}"]) for s in (3, 4))
    assert (a.sft.seed, b.sft.seed) == (3, 4)
    assert (a.eval.seed, b.eval.seed) == (3, 4) and a.eval.seed_by_step
    assert not a.eval.share_start or a.eval.seed == a.sft.seed  # step 0 is shared within a seed only


def test_the_regime_the_design_names():
    cfg = train_config(["experiment=power2", "clipping=clip", "seed=0"])
    tr = cfg.trainer
    prompts_per_rollout = tr.per_device_train_batch_size * cfg.steps_per_generation // tr.num_generations
    rollouts = tr.max_steps // cfg.optimizer_steps_per_rollout
    assert (prompts_per_rollout, rollouts, cfg.optimizer_steps_per_rollout) == (64, 2, 64)
    assert prompts_per_rollout * rollouts >= 128  # distinct training prompts per run
    assert tr.temperature == cfg.eval.temperature == 1.6  # the evaluated policy is the trained one
    assert cfg.eval.every_steps == 32 and cfg.data.num_eval == 256
    assert cfg.model.tiny.pretrain_chain_ops < cfg.data.chain_min  # no evaluation chain in pretraining


def test_the_plan_compares_methods_the_experiment_runs():
    the_plan = plan.load_plan(REPO / "results/power2/plan.yaml")
    assert the_plan.experiment == "power2" and the_plan.seeds == tuple(range(10))
    methods = {tuple(o for o in run if not o.startswith("seed=")) for run in launch.load_plan("power2").expand()}
    labels = {rundir.method_label(compose(list(m)).clipping) for m in methods}
    assert len(labels) == 6  # five methods and the identity check
    compared = {m for c in (the_plan.primary, *the_plan.secondary) for m in (c.a, c.b)}
    assert compared <= labels
    assert {"clip-eps0.329", "clip-eps0.422"} <= compared
