"""End-to-end runs of `experiment=smoke` on the tiny model (CPU): the run directory, the clipping rule binding
off-policy and not on-policy (each 2026 rival too), adaptive δ moving with the measured KL3, resume after a kill
(adaptive δ included), the evaluation callback, and run-directory safety."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from conftest import REPO, compose
from omegaconf import OmegaConf
from transformers import TrainerCallback

from atr_grpo import rundir
from atr_grpo.config_hydra import config_from_yaml, to_object
from atr_grpo.data.arithmetic import task_splits
from atr_grpo.data.datasets import prompt_id
from atr_grpo.provenance import weights_sha256
from atr_grpo.rundir import layout
from atr_grpo.training.pipeline import RunDirError, run_training
from atr_grpo.training.prompts_seen import DISTINCT_KEY, HASH_KEY
from atr_grpo.training.sft import sft_cache_key

pytestmark = pytest.mark.slow

# A large step size and a narrow clip range, so that a reused rollout is visibly stale after one update
BINDING = ["clipping=clip", "clipping.eps=0.05", "trainer.learning_rate=1e-3", "eval=none"]


def smoke(run_dir, overrides=(), callbacks=()):
    cfg = compose(["experiment=smoke", f"run_dir={run_dir}", *overrides])
    return run_training(to_object(cfg), OmegaConf.to_yaml(cfg, resolve=True), callbacks=callbacks)


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / rundir.METRICS_FILE).read_text().splitlines()]


@pytest.fixture(autouse=True)
def in_repo(monkeypatch, tiny_model_dir):
    monkeypatch.chdir(REPO)  # the tiny model and SFT adapter caches live under the repo's results/cache


@pytest.fixture(scope="module")
def atr_smoke(tmp_path_factory, tiny_model_dir):
    """One full smoke run with ATR and evaluation at steps 0, 2 and 4: its run directory and what it printed."""
    import contextlib
    import io
    import os

    from atr_grpo import console

    old = os.getcwd()
    os.chdir(REPO)
    printed = io.StringIO()
    try:  # no heartbeat line: the line count must not depend on how fast this machine trains
        with (
            contextlib.redirect_stdout(printed),
            contextlib.redirect_stderr(printed),
            pytest.MonkeyPatch.context() as mp,
        ):
            mp.setattr(console, "HEARTBEAT_S", float("inf"))
            run_dir = smoke(tmp_path_factory.mktemp("atr") / "run")
    finally:
        os.chdir(old)
    return run_dir, printed.getvalue()


@pytest.fixture(scope="module")
def atr_run(atr_smoke):
    return atr_smoke[0]


def test_smoke_run_writes_every_run_file(atr_run):
    """config.yaml, env.json, metrics.jsonl (with the contract's keys each step), checkpoints, DONE, adapter."""
    config = OmegaConf.load(atr_run / rundir.CONFIG_FILE)
    assert config.clipping.name == "atr" and config.clipping.delta == 0.07
    assert config.trainer.loss_agg == "dr_grpo" and config.trainer.scale_rewards == "none"
    assert config.trainer.truncation == "zero", "a truncated completion earns 0, as the evaluation scores it"
    env = json.loads((atr_run / rundir.ENV_FILE).read_text())
    assert {"torch", "transformers", "trl"} <= set(env["packages"])
    start = env["start_point"]  # the adapter GRPO started from: its cache key and the hash of its weights
    adapter = REPO / config.sft.cache_dir / start["sft_adapter"]  # (REPO / an absolute path is that path)
    assert start["sft_adapter"] == sft_cache_key(config_from_yaml((atr_run / rundir.CONFIG_FILE).read_text()))
    assert start["sft_adapter_sha256"] == weights_sha256(adapter) and len(start["sft_adapter_sha256"]) == 64
    assert start["base_model"].startswith("tiny/") and len(start["base_model_sha256"]) == 64
    rows = metrics(atr_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        for key in (
            "entropy",
            "clip/frac",
            "clip/frac_low",
            "clip/frac_high",
            "ratio/mean",
            "ratio/min",
            "ratio/max",
            "learning_rate",
            "step_time",
            "loss",
            "completions/truncated_frac",  # every step: the share of its completions that ran out of tokens
        ):
            assert isinstance(row[key], float), (key, row)
        finished = row["completions/finish_length"], row["completions/finish_stop"]  # and how many, each way
        assert row["completions/finish_length"] == pytest.approx(row["completions/truncated_frac"] * sum(finished))
    for row in rows[0::2]:  # generation steps carry the return and the completion length
        assert 0.0 <= row["reward"] <= 1.0 and row["completion_length"] > 0
    assert json.loads((atr_run / rundir.DONE_FILE).read_text())["step"] == 4
    assert (atr_run / "final_adapter" / "adapter_model.safetensors").exists()
    checkpoints = sorted(p.name for p in (atr_run / rundir.CHECKPOINT_DIR).glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2", "checkpoint-4"]


def prompts_seen(run_dir):
    """(how many distinct training prompts, the hash of their ids) from the run's train summary."""
    summary = json.loads((run_dir / layout.TRAIN_SUMMARY_FILE).read_text())
    return summary[DISTINCT_KEY], summary[HASH_KEY]


def test_the_train_summary_counts_the_distinct_training_prompts_seen(atr_run):
    """The last checkpoint records each step's prompt ids, all of them training prompts; the train summary holds how
    many distinct ones there are and the sha256 of their sorted ids."""
    config = config_from_yaml((atr_run / rundir.CONFIG_FILE).read_text())
    record = json.loads((atr_run / rundir.CHECKPOINT_DIR / "checkpoint-4" / layout.PROMPTS_SEEN_FILE).read_text())
    assert sorted(map(int, record["by_step"])) == [1, 3]  # reuse2: one generation batch per two optimizer steps
    seen = set().union(*record["by_step"].values())
    assert seen <= {prompt_id(p.question) for p in task_splits(config.data)[0]}
    count, digest = prompts_seen(atr_run)
    assert count == len(seen) > 0
    assert digest == hashlib.sha256("\n".join(sorted(seen)).encode()).hexdigest()


def test_the_console_shows_the_grpo_stage_line_and_no_log_dicts(atr_smoke):
    """The run prints its GRPO stage as one line per step (4 steps: each a tenth or more) ending at 4/4 with the
    last logged reward, entropy, clip/frac and KL3 of metrics.jsonl, and none of the Trainer's raw log dicts."""
    run_dir, printed = atr_smoke
    assert "{'" not in printed
    lines = [line for line in printed.splitlines() if line.startswith("GRPO: ")]
    assert len(lines) == 5 and "100% 4/4" in lines[-1]
    rows = metrics(run_dir)
    last, rewarded = rows[-1], [r for r in rows if "reward" in r][-1]
    shown = f"reward {rewarded['reward']:.3g}, entropy {last['entropy']:.3g}, clip/frac {last['clip/frac']:.3g}"
    assert lines[-1].endswith(f"{shown}, KL3 {last['kl/kl3_mean']:.3g}")


def test_evaluation_callback_writes_eval_files_at_0_2_4(atr_run):
    """The in-training evaluator runs at step 0, every eval.every_steps and at the end (contracts §3)."""
    summary = [json.loads(line) for line in (atr_run / "eval" / "summary.jsonl").read_text().splitlines()]
    assert [(s["step"], s["benchmark"]) for s in summary] == [(0, "arithmetic"), (2, "arithmetic"), (4, "arithmetic")]
    for row in summary:
        assert row["num_problems"] == 8 and row["n"] == 4
        assert 0.0 <= row["mean@4"] <= row["pass@4"] <= 1.0
    samples = (atr_run / "eval" / "step_000002" / "arithmetic.jsonl").read_text().splitlines()
    assert len(samples) == 8 * 4
    first = json.loads(samples[0])
    assert {"problem_id", "sample", "completion", "extracted", "gold", "correct", "finish_reason", "num_tokens"} <= set(
        first
    )


def test_clipping_binds_off_policy(tmp_path):
    """rollout=reuse2: the second step of each rollout is off-policy (w ≠ 1) and clip/frac > 0 there."""
    rows = metrics(smoke(tmp_path / "run", BINDING))
    on_policy, stale = rows[0::2], rows[1::2]
    for row in on_policy:
        assert row["clip/frac"] == 0.0 and row["ratio/min"] == row["ratio/max"] == pytest.approx(1.0)
    for row in stale:
        assert row["ratio/max"] > 1.0 or row["ratio/min"] < 1.0
        assert row["clip/frac"] > 0.0


def test_clipping_cannot_act_on_policy_and_says_so(tmp_path, caplog):
    """rollout=on_policy (Table 4 literally): w ≡ 1 every step, clip/frac = 0, and a warning saying on-policy."""
    rows = metrics(smoke(tmp_path / "run", [*BINDING, "rollout=on_policy"]))
    assert "on-policy" in caplog.text
    for row in rows:
        assert row["clip/frac"] == 0.0
        assert row["ratio/min"] == pytest.approx(1.0) and row["ratio/max"] == pytest.approx(1.0)


# The 2026 rivals each train and act: one rollout, two steps at BINDING's step size. Step 1 is on-policy, so the rule
# changes nothing; step 2 reuses the rollout after one update. The metric each rule acts through:
RIVALS = {
    "cppo": "clip/frac",
    "drpo": "drpo/penalty",  # freezes no token: its penalty is 0 exactly where w = 1
    "minpro": "clip/frac",  # tokens whose preceding prefix weighs them down or up
    "dppo_topk_tv": "clip/frac",
    "dppo_topk_kl": "clip/frac",
    "nsr": "nsr/frac_rescued",
    "erc": "erc/frac_dropped",
}


@pytest.mark.parametrize("rule", sorted(RIVALS))
def test_each_2026_rival_trains_and_acts_only_off_policy(tmp_path, rule):
    """The rule's metric is 0 at the on-policy step and positive at the stale one; both losses are finite. (At the
    smoke run's own rate, 3e-4, CPPO's default δ = 0.15 is never reached on the tiny model: 1e-3 here.)"""
    run = smoke(
        tmp_path / "run", [f"clipping={rule}", "trainer.learning_rate=1e-3", "eval=none", "trainer.max_steps=2"]
    )
    on_policy, stale = metrics(run)
    metric = RIVALS[rule]
    assert on_policy[metric] == 0.0 and stale[metric] > 0.0, (on_policy[metric], stale[metric])
    assert math.isfinite(on_policy["loss"]) and math.isfinite(stale["loss"])


class Preempted(Exception):
    pass


class Kill(TrainerCallback):
    """Stops the process (as a preemption would) right after the checkpoint of `step` is on disk."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Preempted(f"killed after step {self.step}")


COMPARED = (
    "loss",
    "grad_norm",
    "reward",
    "entropy",
    "clip/frac",
    "ratio/mean",
    "ratio/max",
    "completion_length",
    "completions/truncated_frac",
    "completions/finish_length",
)


def assert_same_metrics(whole, resumed, compared=COMPARED):
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(whole, resumed):
        for key in compared:
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)


def assert_resume_matches(run_dir, overrides, whole, compared=COMPARED):
    """Kill a run after step 2, launch the same command again: it ends with `whole`'s metrics."""
    with pytest.raises(Preempted):
        smoke(run_dir, overrides, callbacks=[Kill(2)])
    assert not (run_dir / rundir.DONE_FILE).exists()
    smoke(run_dir, overrides)  # the same command again: continues from checkpoint-2
    assert_same_metrics(whole, metrics(run_dir), compared)
    env = json.loads((run_dir / rundir.ENV_FILE).read_text())
    assert len(env["resumes"]) == 1


RESUMED = ["clipping=clip_cov", "eval=none", "trainer.learning_rate=1e-3"]  # clip_cov: seeded randomness too


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory, tiny_model_dir):
    """An uninterrupted run with RESUMED's settings."""
    import os

    old = os.getcwd()
    os.chdir(REPO)
    try:
        return smoke(tmp_path_factory.mktemp("whole") / "run", RESUMED)
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run):
    """The metrics of an uninterrupted run with RESUMED's settings."""
    return metrics(uninterrupted_run)


def test_resume_after_a_kill_matches_an_uninterrupted_run(uninterrupted_run, tmp_path):
    """Killed after step 2 and re-launched, a run ends with the same metrics as an uninterrupted one
    (optimizer, scheduler, RNG and step restored; the killed run's later metric lines are set aside), and has seen
    the same training prompts: their count and hash in the train summary."""
    assert_resume_matches(tmp_path / "killed", RESUMED, metrics(uninterrupted_run))
    assert prompts_seen(tmp_path / "killed") == prompts_seen(uninterrupted_run)


def checkpoint_names(run_dir):
    """The folders under checkpoints/ (TRL also writes a model card there)."""
    return sorted(p.name for p in (run_dir / rundir.CHECKPOINT_DIR).iterdir() if p.is_dir())


def test_a_kill_during_a_checkpoint_save_loses_only_the_steps_since_the_previous_one(
    uninterrupted, tmp_path, monkeypatch
):
    """Killed while checkpoint-4 is being written (its weights and optimizer saved, not yet its RNG state and
    trainer state): there is no checkpoint-4, and the re-launched run continues from checkpoint-2, retrains steps 3
    and 4 and ends with the uninterrupted run's metrics."""
    from transformers import Trainer

    save_rng_state = Trainer._save_rng_state

    def killed_mid_save(self, output_dir):
        if self.state.global_step == 4:
            raise Preempted("killed while saving checkpoint-4")
        return save_rng_state(self, output_dir)

    run_dir = tmp_path / "run"
    monkeypatch.setattr(Trainer, "_save_rng_state", killed_mid_save)
    with pytest.raises(Preempted):
        smoke(run_dir, RESUMED)
    monkeypatch.undo()
    assert checkpoint_names(run_dir) == [".partial-checkpoint-4", "checkpoint-2"]
    smoke(run_dir, RESUMED)
    assert_same_metrics(uninterrupted, metrics(run_dir))
    assert checkpoint_names(run_dir) == ["checkpoint-2", "checkpoint-4"]  # the partial save is gone


def test_a_cut_off_newest_checkpoint_is_skipped_and_kept(uninterrupted, tmp_path, caplog):
    """A newest checkpoint cut off some other way (here: its optimizer state truncated) is named in a warning,
    the run resumes from the checkpoint before it and ends with the uninterrupted run's metrics, and the cut-off
    checkpoint is kept, set aside, when step 4 is saved again."""
    run_dir = tmp_path / "run"
    with pytest.raises(Preempted):
        smoke(run_dir, RESUMED, callbacks=[Kill(4)])
    optimizer = run_dir / rundir.CHECKPOINT_DIR / "checkpoint-4" / "optimizer.pt"
    cut = optimizer.read_bytes()[: optimizer.stat().st_size // 2]
    optimizer.write_bytes(cut)
    caplog.clear()
    smoke(run_dir, RESUMED)
    warning = caplog.text
    assert f"checkpoint {optimizer.parent} is incomplete (optimizer.pt: not a complete torch archive)" in warning
    assert_same_metrics(uninterrupted, metrics(run_dir))
    assert checkpoint_names(run_dir) == ["checkpoint-2", "checkpoint-4", "incomplete-checkpoint-4"]
    assert (run_dir / rundir.CHECKPOINT_DIR / "incomplete-checkpoint-4" / "optimizer.pt").read_bytes() == cut


# ATR whose δ is driven by the measured KL3: a target far below what lr 1e-3 produces, and a gain of 1, so that each
# reused step shrinks δ by the controller's largest factor e^(-0.2)
ADAPTIVE = ["clipping.target_kl3=1e-6", "clipping.delta_rate=1.0", "trainer.learning_rate=1e-3", "eval=none"]


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory, tiny_model_dir):
    import os

    old = os.getcwd()
    os.chdir(REPO)
    try:
        return smoke(tmp_path_factory.mktemp("adaptive") / "run", ADAPTIVE)
    finally:
        os.chdir(old)


def test_adaptive_delta_moves_clip_delta_as_the_controller_says(adaptive_run):
    """clipping=atr clipping.target_kl3=...: clip/delta is logged every step and moves. Steps 1-2 train with δ₀ =
    0.07 (step 1 is on-policy and carries no signal); after the reused step 2, δ = δ₀·exp(−η·clip(m/m* − 1, ±0.2))
    with m its logged kl/kl3_mean, the δ of steps 3 and 4 (step 3 is on-policy again)."""
    rows = metrics(adaptive_run)
    deltas = [row["clip/delta"] for row in rows]
    assert deltas[:2] == pytest.approx([0.07, 0.07], rel=1e-12)
    measured = rows[1]["kl/kl3_mean"]
    assert measured > 0 and rows[0]["kl/kl3_mean"] == 0.0
    expected = 0.07 * math.exp(-1.0 * max(-0.2, min(0.2, measured / 1e-6 - 1)))
    assert deltas[2] == pytest.approx(expected, rel=1e-9) and deltas[3] == pytest.approx(expected, rel=1e-9)
    assert deltas[2] < 0.069  # it moved, toward a tighter trust region


def test_adaptive_delta_is_restored_on_resume(adaptive_run, tmp_path):
    """The δ in force is saved with each checkpoint: killed after step 2, the resumed run trains step 3 with the δ
    the controller had reached, and ends with the uninterrupted run's metrics, clip/delta included."""
    whole = metrics(adaptive_run)
    assert_resume_matches(tmp_path / "killed", ADAPTIVE, whole, (*COMPARED, "clip/delta", "kl/kl3_mean"))


def test_a_finished_run_is_left_as_is(atr_run, capsys):
    """Re-launching a finished run changes nothing."""
    before = (atr_run / rundir.METRICS_FILE).read_text()
    smoke(atr_run)
    assert "already finished" in capsys.readouterr().out
    assert (atr_run / rundir.METRICS_FILE).read_text() == before


def test_a_different_config_never_reuses_a_run_directory(atr_run):
    """Another config pointed at an existing run is refused before anything is written."""
    before = sorted(p.name for p in atr_run.iterdir())
    with pytest.raises(RunDirError, match="different config.*clipping"):
        smoke(atr_run, ["clipping.delta=0.05"])
    assert sorted(p.name for p in atr_run.iterdir()) == before


def test_resume_true_needs_a_run_and_stray_files_are_not_overwritten(tmp_path):
    with pytest.raises(RunDirError, match="no run to continue"):
        smoke(tmp_path / "empty", ["resume=true"])
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / rundir.METRICS_FILE).write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="refusing"):
        smoke(stray, ["eval=none"])
    assert (stray / rundir.METRICS_FILE).read_text() == '{"step": 1}\n'


def test_final_eval_evaluates_the_final_adapter_at_the_plans_sampling(atr_run, tmp_path, capsys):
    """`python -m atr_grpo.final_eval`: the run's final adapter at the plan's temperature and top-p, with the draws of
    its final step, into <run>/<folder>/eval/; the run's own files untouched; a second call keeps it; another
    temperature is refused, naming the key and both values."""
    import shutil

    import yaml
    from helpers.plans import plan_with_final_evaluation

    from atr_grpo import final_eval
    from atr_grpo.evaluation.sampling import step_seed

    run = tmp_path / "runs" / atr_run.name
    shutil.copytree(atr_run, run, ignore=shutil.ignore_patterns(rundir.CHECKPOINT_DIR))
    own = (run / "eval" / "summary.jsonl").read_text()
    plan = plan_with_final_evaluation(experiment="smoke", endpoint="final", equivalence_margin=1.0)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    assert final_eval.main(["--runs", str(tmp_path / "runs")]) == 0
    config = OmegaConf.load(run / rundir.CONFIG_FILE)
    (line,) = [json.loads(x) for x in (run / "final_eval" / "eval" / "summary.jsonl").read_text().splitlines()]
    assert (line["step"], line["benchmark"], line["n"]) == (4, "arithmetic", config.eval.n)
    drawn = step_seed(config.eval.seed, 4) if config.eval.seed_by_step else config.eval.seed
    (own_final,) = [json.loads(x) for x in own.splitlines() if json.loads(x)["step"] == 4]
    assert line["drawn_seed"] == drawn == own_final["drawn_seed"]  # the draws of the run's own final evaluation
    request = json.loads((run / "final_eval" / "eval" / "request.json").read_text())
    assert (request["eval.temperature"], request["eval.top_p"]) == (0.3, 0.95)
    assert request["adapter"] == str((run / "final_adapter").resolve()) and len(request["adapter_sha256"]) == 64
    samples = (run / "final_eval" / "eval" / "step_000004" / "arithmetic.jsonl").read_text().splitlines()
    assert len(samples) == line["num_problems"] * config.eval.n
    assert (run / "eval" / "summary.jsonl").read_text() == own
    capsys.readouterr()
    assert final_eval.main(["--runs", str(tmp_path / "runs")]) == 0
    assert "of 0 runs; 1 evaluated before, kept" in capsys.readouterr().out
    plan["final_evaluation"]["temperature"] = 0.5
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    assert final_eval.main(["--runs", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "eval.temperature: stored 0.3, requested 0.5" in err and "final_evaluation.folder, final_eval" in err
