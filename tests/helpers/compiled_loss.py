"""The Unsloth path's machinery for the tests: unsloth_zoo's loss module loaded on a CPU machine, a rule installed in
its compiled loss, the TRL path's loss to compare with, and the two checks every rule gets inside the compiled loss
(the same loss and gradient as the TRL path, in TRL's layout and in Unsloth's left-packed one).

unsloth_zoo is installed without its dependencies on CPU machines and imported with
UNSLOTH_ZOO_DISABLE_GPU_INIT=1; its stand-in `triton` module would make Inductor believe Triton exists,
so Inductor's Triton probes run first (they are cached), and afterwards the stand-ins are removed and the modules
they replaced put back.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager, suppress
from dataclasses import replace
from unittest.mock import patch

import pytest
import torch

from atr_grpo.clipping import build_rule
from atr_grpo.clipping.extras import SAMPLING_LOG_RATIO
from atr_grpo.losses import LossSettings, aggregate
from atr_grpo.rollout_correction import sampling_log_ratio
from atr_grpo.rule_random import micro_batch_stream
from atr_grpo.training.extras import TRAINER_PROVIDERS, TrainerBatch, trainer_extras
from atr_grpo.training.unsloth_loss import encode_extras, install_rule

MAX_LEN, GA = 16, 2
MICRO_STEP = 3 * GA + 1  # the second micro-batch of the optimizer step after global step 3
SETTINGS = LossSettings(loss_agg="dr_grpo", max_completion_length=MAX_LEN)


@contextmanager
def installed(namespace, rule, settings=SETTINGS, on_policy=False):
    """The rule inside zoo's loss globals for the block; zoo's own functions are back afterwards."""
    restore = install_rule(namespace, rule, settings, on_policy)
    try:
        yield
    finally:
        restore()


@contextmanager
def loaded_zoo():
    """unsloth_zoo's loss module for the block (a module fixture `zoo` of each test file that needs it): imported
    with UNSLOTH_ZOO_DISABLE_GPU_INIT=1, its stand-in modules taken out of sys.modules afterwards."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("unsloth_zoo") is None:  # not imported yet: the env switch must come first
        pytest.skip("unsloth_zoo is installed by `make install`")
    import torch._dynamo
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.runtime.triton_compat  # noqa: F401
    import torch.utils._triton as triton_probe

    triton_probe.has_triton()  # cached: the answer stays "no Triton" after zoo's stand-in appears
    replaced = ("triton", "bitsandbytes")  # zoo puts its stand-ins in sys.modules, over the real ones if imported
    before = {name: module for name, module in sys.modules.items() if name.split(".")[0] in replaced}
    saved_env = os.environ.get("UNSLOTH_ZOO_DISABLE_GPU_INIT")
    os.environ["UNSLOTH_ZOO_DISABLE_GPU_INIT"] = "1"
    import unsloth_zoo.rl_replacements as zoo_loss

    # zoo's stand-in says Triton 3.0.0, and AOTAutograd keeps no cache of traced graphs below 3.2.0 (for a CUDA
    # reason): it reports the installed Triton's version, so that a later run reuses them, as on a GPU machine
    stand_in = sys.modules.get("triton")
    with suppress(importlib.metadata.PackageNotFoundError):  # no Triton installed: AOTAutograd does not ask
        if stand_in is not None:
            stand_in.__version__ = importlib.metadata.version("triton")
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 256  # one graph per rule; the limit would switch zoo to eager
    os.environ["UNSLOTH_HARD_BACKEND_FAILURE"] = "1"  # a compile failure must fail the test, not fall back
    yield zoo_loss
    torch._dynamo.config.recompile_limit = limit
    os.environ.pop("UNSLOTH_HARD_BACKEND_FAILURE", None)
    if saved_env is None:
        os.environ.pop("UNSLOTH_ZOO_DISABLE_GPU_INIT", None)
    # the stand-ins must not leak into later tests: a stand-in `triton.runtime.driver` reports an active driver, so
    # `compat.triton_unusable_reason` would let TRL launch its real Triton kernel on a CPU machine
    for name in [name for name in sys.modules if name.split(".")[0] in replaced]:
        del sys.modules[name]
    sys.modules.update(before)


def random_batch(seed: int, batch: int = 6, steps: int = 12):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, steps, generator=g) * 3
    logp = old + torch.randn(batch, steps, generator=g) * 0.5  # ratios well outside every clip range
    lengths = torch.randint(2, steps + 1, (batch,), generator=g)
    mask = (torch.arange(steps)[None, :] < lengths[:, None]).long()  # right-padded, as TRL builds it
    advantages = torch.randn(batch, generator=g)
    full_kl = torch.rand(batch, steps, generator=g) * 0.15
    return logp, old, advantages, mask, full_kl


def left_packed(values: torch.Tensor, mask: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout Unsloth's loss sees: each row's valid tokens moved right behind a row-dependent left pad."""
    batch, steps = values.shape
    out = torch.zeros(batch, steps + pad, dtype=values.dtype)
    packed_mask = torch.zeros(batch, steps + pad, dtype=mask.dtype)
    for row in range(batch):
        n = int(mask[row].sum())
        start = steps + pad - n - (row % 3)  # uneven right gaps as well
        out[row, start : start + n] = values[row, :n]
        packed_mask[row, start : start + n] = 1
    return out, packed_mask


def stand_in_providers(values):
    """The trainer's providers with each one that runs the model (full_kl's vocabulary pass, tested in
    test_full_kl; the token entropy, in test_token_entropy) returning the batch's per-token `values` instead: the
    trainers here have no model. Use with `patch.dict(TRAINER_PROVIDERS, ...)`."""
    # an entropy ratio near 1 (values are in [0, 0.15]): ERC keeps some tokens' gradient and drops others'
    offsets = {"entropy_ratio": 0.96}

    def stand_in(offset: float):
        return lambda batch: values + offset

    return {
        name: replace(provider, compute=stand_in(offsets.get(name, 0.0)))
        for name, provider in TRAINER_PROVIDERS.items()
        if provider.runs_model
    }


def trainer_side(rule, full_kl, micro_step: int = MICRO_STEP):
    """The rule's extras as the trainer provides them at seed 0, optimizer step 3, `micro_step` (`training.extras`)."""
    batch = TrainerBatch(
        like=full_kl,
        on_policy=False,
        random=lambda: micro_batch_stream(0, 3, micro_step),
        model=None,
        old_weights=None,
        input_ids=None,
        attention_mask=None,
        logits_to_keep=full_kl.shape[1],
        temperature=1.0,
    )
    with patch.dict(TRAINER_PROVIDERS, stand_in_providers(full_kl)):
        return trainer_extras(rule.needs, batch)


def engine_logp(rule, old, seed: int = 21):
    """The rollout engine's log-probs for a rule that owns the rollout correction (which needs them), else None."""
    if not rule.owns_correction:
        return None
    return old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(seed))


def trl_path(rule, logp, old, advantages, mask, full_kl, micro_step: int = MICRO_STEP, sampling=None):
    """What RuleGRPOTrainer._compute_loss computes (tests/training/test_training_trl_path.py ties it to TRL's loss)."""
    extras = trainer_side(rule, full_kl, micro_step)
    if sampling is not None:  # a rule that owns the correction: grpo_loss's input from the engine's log-probs
        extras[SAMPLING_LOG_RATIO] = sampling_log_ratio(old, sampling, mask.bool())
    leaf = logp.clone().requires_grad_()
    out = rule(leaf, old, advantages, mask, **extras)
    loss = aggregate(out.loss, mask, "dr_grpo", MAX_LEN) / GA
    loss.backward()
    return loss.detach(), leaf.grad, out.metrics


def unsloth_kwargs(rule, full_kl, mask, micro_step: int = MICRO_STEP):
    extras = trainer_side(rule, full_kl, micro_step)
    return {"max_completion_length": MAX_LEN, "current_gradient_accumulation_steps": GA, **encode_extras(extras, mask)}


def efficient_grpo(zoo, logp, old, advantages, mask, kwargs, sampling=None):
    leaf = logp.clone().requires_grad_()
    ids = torch.zeros(mask.shape, dtype=torch.long)
    outputs = zoo.UnslothEfficientGRPO.apply(
        leaf, old, None, sampling, torch.empty(1), ids, mask, advantages, 0.0, None, 1, kwargs, None
    )
    outputs[0].backward()
    return outputs, leaf.grad


def compiled_equals_trl(zoo, name):
    """Every rule: same loss and gradient inside UnslothEfficientGRPO (compiled, fullgraph) as on the TRL path."""
    from torch._dynamo.utils import counters

    rule = build_rule(name)
    logp, old, advantages, mask, full_kl = random_batch(0)
    sampling = engine_logp(rule, old)
    want_loss, want_grad, _ = trl_path(rule, logp, old, advantages, mask, full_kl, sampling=sampling)
    graphs = counters["stats"]["unique_graphs"]
    with installed(zoo.__dict__, rule):
        kwargs = unsloth_kwargs(rule, full_kl, mask)
        outputs, grad = efficient_grpo(zoo, logp, old, advantages, mask, kwargs, sampling)
    assert counters["stats"]["unique_graphs"] > graphs, "the loss did not go through torch.compile"
    torch.testing.assert_close(outputs[0], want_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-8)
    assert want_grad.abs().sum() > 0
    coef_1 = outputs[5]
    torch.testing.assert_close(coef_1 * mask, torch.exp(logp - old) * mask)  # feeds Unsloth's clip_ratio/*
    assert zoo.grpo_compute_loss.__module__ == "unsloth_zoo.rl_replacements"  # restored on exit


def compiled_left_packed(zoo, name):
    """Unsloth left-packs padding; token selections (Clip-Cov's hashed keys, the full-KL extra) follow the tokens."""
    rule = build_rule(name)
    logp, old, advantages, mask, full_kl = random_batch(2)
    sampling = engine_logp(rule, old)
    want_loss, want_grad, _ = trl_path(rule, logp, old, advantages, mask, full_kl, sampling=sampling)
    packed_logp, packed_mask = left_packed(logp, mask, pad=5)
    packed_old, _ = left_packed(old, mask, pad=5)
    packed_sampling = None if sampling is None else left_packed(sampling, mask, pad=5)[0]
    packed_logp = packed_logp + (1 - packed_mask) * 7.0  # junk under padding must not matter
    with installed(zoo.__dict__, rule):
        kwargs = unsloth_kwargs(rule, full_kl, mask)
        outputs, grad = efficient_grpo(zoo, packed_logp, packed_old, advantages, packed_mask, kwargs, packed_sampling)
    torch.testing.assert_close(outputs[0], want_loss, rtol=1e-5, atol=1e-7)
    grad_back, _ = left_packed(want_grad, mask, pad=5)
    torch.testing.assert_close(grad, grad_back, rtol=1e-5, atol=1e-8)
