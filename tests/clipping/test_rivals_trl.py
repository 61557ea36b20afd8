"""The rules TRL 1.15 implements and the registry reproduces, against TRL's own `GRPOTrainer._compute_loss` on the
same batch (its model pass replaced by the batch's log-probs), in loss and gradient: VESPO (`loss_type="vespo"`,
with and without the rollout engine's ratios), LUSPO (`loss_type="luspo"`) and DeepSeek-V3.2's off-policy sequence
masking (`off_policy_mask_threshold`), as tests/test_clipping_rivals.py does for GSPO, CISPO and GMPO.

Convention differences, each one asserted below:
- VESPO: TRL folds its token-level `importance_sampling_ratio` (π_old/π_sampler, truncated or masked) into the
  sequence weight; the rule receives log π_old − log π_sampler and applies the same truncation or mask itself
  (`is_mode`, `is_max`, `is_min`). TRL divides by the batch's token count: `token_mean`, the rule's native
  aggregation.
- LUSPO: TRL's loss is Σ_t ℓ summed per sequence and averaged over sequences; ours is the same per-token loss under
  `dr_grpo` (its native aggregation), i.e. TRL's divided by max_completion_length, in value and in gradient.
- OPSM: TRL measures the drift from the engine's log-probs when it has them, else from π_old; the rule always from
  π_old. Without the engine's log-probs the two are the same; TRL's default `dapo` aggregation is `token_mean`.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers.trl_loss import grpo_settings, trl_compute_loss

from atr_grpo.clipping import build_rule
from atr_grpo.losses import LossSettings, grpo_loss, resolve_aggregation

VESPO_DEFAULTS = {"vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0}


def batch(seed: int, rows: int = 16, steps: int = 12, spread: float = 0.05):
    """Right-padded rows of lengths 1..steps, log-ratios of about `spread` per token, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, steps, generator=g) * 3 - 0.05
    logp = old + torch.randn(rows, steps, generator=g) * spread
    lengths = torch.randint(1, steps + 1, (rows,), generator=g)
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    return logp, old, torch.randn(rows, generator=g), mask


def trl(logp, old, advantages, mask, loss_type, *, level="token", epsilon=(0.2, 0.2), threshold=None, engine=None):
    """TRL 1.15's `GRPOTrainer._compute_loss` on the given log-probs: (loss, gradient, TRL's logged metrics).

    `engine`: extra inputs of a vLLM rollout (`importance_sampling_ratio`, `sampling_per_token_logps`), with TRL's
    IS correction on; without it TRL runs as without vLLM."""
    from trl import GRPOTrainer

    settings = grpo_settings(
        logp,
        loss_type,
        level,
        *epsilon,
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        off_policy_mask_threshold=threshold,
        args=SimpleNamespace(delta=None, steps_per_generation=1, **VESPO_DEFAULTS),
        use_vllm=engine is not None,
        vllm_importance_sampling_correction=engine is not None,
    )
    inputs = {"num_items_in_batch": mask.sum(), **(engine or {})}
    return trl_compute_loss(GRPOTrainer, logp, old, advantages, mask, inputs, **settings)


def ours(name, logp, old, advantages, mask, mode, params=None, sampling=None):
    """Our loss through `losses.grpo_loss`, the composition both trainer paths call: (loss, gradient, metrics)."""
    rule = build_rule(name, **(params or {}))
    leaf = logp.clone().requires_grad_()
    settings = LossSettings(loss_agg=mode, max_completion_length=logp.shape[1])
    result = grpo_loss(rule, leaf, old, advantages, mask, settings, sampling_logp=sampling)
    result.loss.backward()
    return result.loss.detach(), leaf.grad, result.metrics()


def assert_same(mine, theirs, scale: float = 1.0):
    torch.testing.assert_close(mine[0] * scale, theirs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine[1] * scale, theirs[1], rtol=1e-5, atol=1e-7)
    assert theirs[1].abs().sum() > 0


# ----------------------------------------------------------------------------------------------- VESPO
def engine_ratio(old, sampling, mask, mode, clip_max=3.0, clip_min=None):
    """TRL 1.15's token-level `importance_sampling_ratio` (grpo_trainer.py, `_generate_and_score_completions`),
    re-typed: the part of TRL's pipeline that runs before `_compute_loss`."""
    ratio = torch.exp(torch.nan_to_num((old - sampling) * mask, nan=0.0))
    if mode == "token_truncate":
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    return ratio.masked_fill((ratio < low) | (ratio > clip_max), 0.0)


def vespo_oracle(logp, old, log_r, advantages, mask, k=(2.0, 3.0), lam=(3.0, 2.0)):
    """VESPO's loss and gradient from its equation in float64 loops: W = Π_t w_t·r_t over the valid tokens,
    φ = e^λ·W^k·e^(−λW), loss −φ·A·log π, gradient −φ·A."""
    loss, grad = torch.zeros_like(logp, dtype=torch.float64), torch.zeros_like(logp, dtype=torch.float64)
    for i in range(logp.shape[0]):
        columns = [t for t in range(logp.shape[1]) if mask[i, t]]
        log_w = sum(float(logp[i, t] - old[i, t]) + float(log_r[i, t]) for t in columns)
        a = float(advantages[i])
        k_i, lam_i = (k[0], lam[0]) if a >= 0 else (k[1], lam[1])
        phi = math.exp(lam_i + k_i * log_w - lam_i * math.exp(log_w))
        for t in columns:
            loss[i, t], grad[i, t] = -phi * a * float(logp[i, t]), -phi * a
    return loss, grad


def test_vespo_matches_its_equation():
    """Loss and gradient per token against the float64 oracle, with the engine's ratios inside every band (so
    neither truncation nor mask acts); the sequence weights spread well away from 1."""
    logp, old, advantages, mask = batch(1, spread=0.08)
    log_r = torch.where(mask, 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2)), 0.0)
    leaf = logp.clone().requires_grad_()
    out = build_rule("vespo")(leaf, old, advantages, mask, sampling_log_ratio=log_r)
    out.loss.sum().backward()
    want_loss, want_grad = vespo_oracle(logp, old, log_r, advantages, mask)
    torch.testing.assert_close(out.loss.double(), want_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(leaf.grad.double(), want_grad, rtol=1e-5, atol=1e-6)
    assert out.metrics["clip/frac"] == 0 and abs(out.metrics["vespo/phi"] - 1) > 0.01


def test_vespo_weight_is_one_at_w_one_and_largest_at_k_over_lambda():
    """φ(1) = 1 on both sides; on one-token sequences φ peaks at W = k/λ (2/3 for A ≥ 0, 3/2 for A < 0)."""
    ws = torch.linspace(0.2, 3.0, 281, dtype=torch.float64)
    old = torch.full((ws.numel(), 1), -1.0)
    mask = torch.ones_like(old, dtype=torch.bool)
    for sign, peak in ((1.0, 2 / 3), (-1.0, 3 / 2)):
        advantages = torch.full((ws.numel(),), sign)
        leaf = (old + torch.log(ws)[:, None].float()).requires_grad_()
        out = build_rule("vespo")(leaf, old, advantages, mask, sampling_log_ratio=torch.zeros_like(old))
        out.loss.sum().backward()
        phi = -leaf.grad[:, 0] / sign
        assert float(ws[int(phi.argmax())]) == pytest.approx(peak, abs=0.011)
        assert float(phi[int(torch.argmin((ws - 1).abs()))]) == pytest.approx(1.0, abs=1e-5)


def test_vespo_without_the_engines_ratios_equals_trl():
    """TRL without vLLM (no `importance_sampling_ratio`): W = Π_t w_t; ours with a sampler equal to π_old."""
    logp, old, advantages, mask = batch(3, spread=0.08)
    theirs = trl(logp, old, advantages, mask, "vespo")
    mine = ours("vespo", logp, old, advantages, mask, "token_mean", sampling=old)
    assert_same(mine, theirs)
    assert resolve_aggregation("native", build_rule("vespo"))[0] == "token_mean"


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask"])
def test_vespo_with_the_engines_ratios_equals_trl(mode):
    """TRL with vLLM's log-probs and its token-level correction folded into W, against the rule owning the
    correction (`is_mode`), through grpo_loss: some engine ratios exceed TRL's C_max = 3, so the truncation, or
    the mask (which floors log r at log 1e-8 and so all but zeroes φ of the whole sequence), acts."""
    logp, old, advantages, mask = batch(4, spread=0.05)
    g = torch.Generator().manual_seed(5)
    sampling = old + 0.05 * torch.randn(old.shape, generator=g)
    sampling[::5, 0] = old[::5, 0] - 1.5  # r = e^1.5 ≈ 4.5 > 3 on the first token of every fifth row
    engine = {
        "importance_sampling_ratio": engine_ratio(old, sampling, mask, mode),
        "sampling_per_token_logps": sampling,
    }
    theirs = trl(logp, old, advantages, mask, "vespo", engine=engine)
    params = {"is_mode": mode.removeprefix("token_")}
    mine = ours("vespo", logp, old, advantages, mask, "token_mean", params, sampling=sampling)
    assert_same(mine, theirs)
    plain = ours("vespo", logp, old, advantages, mask, "token_mean", params, sampling=old)
    assert (plain[0] - mine[0]).abs() > 1e-4  # the engine's ratios change the weights
    trl_phi = trl_gamma_weights(logp, old, advantages, mask, engine["importance_sampling_ratio"])
    assert mine[2]["vespo/phi"] == pytest.approx(float((trl_phi * mask).sum() / mask.sum()), rel=1e-5)


def trl_gamma_weights(logp, old, advantages, mask, ratio):
    """TRL's own φ per token (`GRPOTrainer.get_gamma_weights`, broadcast over the sequence)."""
    from trl import GRPOTrainer

    phi = GRPOTrainer.get_gamma_weights(advantages[:, None], logp - old, mask, ratio, **vespo_kwargs())
    return phi.expand_as(logp)


def vespo_kwargs():
    return {key.removeprefix("vespo_"): value for key, value in VESPO_DEFAULTS.items()}


# ----------------------------------------------------------------------------------------------- LUSPO
def test_luspo_is_trl_luspo_over_max_completion_length():
    """TRL's `luspo` at sequence level with GSPO's ranges: (ℓ·mask).sum(-1).mean(); ours under dr_grpo (native)
    is that divided by L_max, in value and gradient; several sequences are clipped on each side."""
    logp, old, advantages, mask = batch(6, spread=0.003)
    theirs = trl(logp, old, advantages, mask, "luspo", level="sequence", epsilon=(3e-4, 4e-4))
    mode, notice = resolve_aggregation("native", build_rule("luspo"))
    assert (mode, notice) == ("dr_grpo", None)
    mine = ours("luspo", logp, old, advantages, mask, mode)
    assert_same(mine, theirs, scale=logp.shape[1])
    assert 0.1 < mine[2]["clip/frac"] < 0.9
    assert theirs[2]["clip_ratio/region_mean"] > 0


def test_luspo_weighs_each_sequence_by_its_length_where_gspo_does_not():
    """Per sequence, LUSPO's gradient summed over a sequence's tokens is |y_i| times GSPO's under their native
    aggregations (up to the constant L_max / B of dr_grpo vs 1 / B of seq_mean); with equal lengths they agree."""
    logp, old, advantages, mask = batch(7, spread=0.003)
    steps = logp.shape[1]
    _, luspo_grad, _ = ours("luspo", logp, old, advantages, mask, "dr_grpo")
    _, gspo_grad, _ = ours("gspo", logp, old, advantages, mask, "seq_mean")
    lengths = mask.sum(-1).double()
    torch.testing.assert_close(
        luspo_grad.double().sum(-1) * steps, gspo_grad.double().sum(-1) * lengths, rtol=1e-5, atol=1e-8
    )


# ------------------------------------------------------------------------------------------------ OPSM
@pytest.mark.parametrize(
    "loss_type,mode", [("dapo", "token_mean"), ("bnpo", "token_mean"), ("dr_grpo", "dr_grpo"), ("grpo", "seq_mean")]
)
def test_opsm_equals_trl_off_policy_mask_threshold(loss_type, mode):
    """TRL's clipped loss with `off_policy_mask_threshold=δ` (no engine log-probs: the drift from π_old) equals
    `opsm` under the matching aggregation; some negative-advantage sequences are dropped, and some positive ones
    beyond δ are kept."""
    logp, old, advantages, mask = batch(8, rows=24, spread=0.3)
    delta, eps = 0.05, (0.2, 0.28)
    theirs = trl(logp, old, advantages, mask, loss_type, epsilon=eps, threshold=delta)
    params = {"eps_low": eps[0], "eps_high": eps[1], "threshold": delta}
    mine = ours("opsm", logp, old, advantages, mask, mode, params)
    assert_same(mine, theirs)
    drift = (torch.where(mask, old - logp, 0.0).sum(-1) / mask.sum(-1)) > delta
    dropped = drift & (advantages < 0)
    assert dropped.sum() >= 2 and (drift & (advantages > 0)).sum() >= 2
    assert mine[2]["opsm/masked"] == pytest.approx(float(mask[dropped].sum() / mask.sum()))
    without = trl(logp, old, advantages, mask, loss_type, epsilon=eps)
    assert (without[0] - theirs[0]).abs() > 1e-4  # the mask does act on this batch


def test_opsm_with_the_sampler_equal_to_pi_old_is_trls_vllm_reading():
    """TRL with vLLM's log-probs measures the drift from them; where they equal π_old (no engine mismatch) its mask
    is ours, and TRL's IS ratio of 1 changes nothing."""
    logp, old, advantages, mask = batch(9, rows=24, spread=0.3)
    engine = {"importance_sampling_ratio": torch.ones_like(old), "sampling_per_token_logps": old.clone()}
    theirs = trl(logp, old, advantages, mask, "dapo", threshold=0.05, engine=engine)
    mine = ours("opsm", logp, old, advantages, mask, "token_mean", {"threshold": 0.05})
    assert_same(mine, theirs)
