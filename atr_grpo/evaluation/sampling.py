"""How an evaluation samples: the settings (`SamplingConfig`) and, for vLLM, one request's settings per prompt.

A seeded vLLM request draws its n samples from generators seeded seed, seed+1, ..., seed+n-1, one random stream
per sample, advanced once per generated token. Given one seed for every prompt, the j-th sample of every problem
would read the same stream, and the samples of different problems would not be independent draws (the measured
effect: docs/evaluation.md, "Every problem samples from streams of its own"). Each prompt therefore gets a seed of
its own, derived from the evaluation's seed and the prompt's token ids: the same problem is sampled alike whatever
else is in the batch, and no two prompts share a stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PROMPT_SEED_BITS = 48  # vLLM takes any int; children add up to n - 1, far below 2**63


@dataclass(frozen=True)
class SamplingConfig:
    """Evaluation sampling (defaults: the paper's Table 4, Mean@8 / Pass@8)."""

    n: int = 8
    temperature: float = 0.3
    top_p: float = 0.95
    top_k: int = -1  # -1 = off
    max_tokens: int = 32768
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_tokens < 1:
            raise ValueError(f"n and max_tokens must be >= 1, got n={self.n}, max_tokens={self.max_tokens}")
        if self.temperature <= 0 and self.n > 1:
            raise ValueError("temperature 0 (greedy) with n > 1 would give n identical samples")
        if not 0 < self.top_p <= 1 or not (self.top_k == -1 or self.top_k > 0):
            raise ValueError(f"need 0 < top_p <= 1 and top_k == -1 or > 0, got {self.top_p}, {self.top_k}")


def prompt_seed(seed: int, token_ids: Sequence[Any]) -> int:
    """The seed of one prompt's request: a hash of the evaluation's seed and the prompt's token ids."""
    text = f"{seed}|" + ",".join(map(str, token_ids))
    return int.from_bytes(hashlib.sha256(text.encode()).digest(), "big") >> (256 - PROMPT_SEED_BITS)


def step_seed(seed: int, step: int) -> int:
    """The evaluation seed of training step `step` under `eval.seed_by_step`: a hash of the two, below 2**32, so
    that every evaluation of a run reads random numbers of its own, and the methods of one seed share them."""
    text = f"{seed}|step {step}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest(), "big") >> (256 - 32)


def vllm_sampling_params(params: SamplingConfig, token_ids: Sequence[Sequence[Any]]) -> list[Any]:
    """vLLM's `SamplingParams`, one per prompt (in the order of `token_ids`), each with its prompt's seed."""
    from vllm import SamplingParams

    return [
        SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,  # vLLM 0.31 accepts -1 (and 0) for "off"
            max_tokens=params.max_tokens,
            seed=prompt_seed(params.seed, ids),
        )
        for ids in token_ids
    ]
