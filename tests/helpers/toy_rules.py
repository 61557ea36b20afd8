"""Toy rules and extras for tests, registered for one block only (`registered`) and removed after it.

- `test_scaled` / `test_sequence_scaled`: −w·A times the extra `token_scale` (`[B, T]`) or `sequence_scale`
  (`[B, 1]`), which the trainer draws from the micro-batch's stream off-policy and sets to 1 on-policy, so the
  loss shows which one reached the rule; verl cannot provide either (`REASON`).
- `test_owned_tis`: a rule that owns the rollout correction (`OwnedTIS`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from atr_grpo.clipping import RULES, ClipRule, RuleTerms, TokenBatch, build_rule, ratio_from_log, register
from atr_grpo.clipping.extras import EXTRAS, Extra, Unavailable, register_extra
from atr_grpo.training.extras import TRAINER_PROVIDERS, TrainerBatch, register_trainer_extra

REASON = "a per-token temperature that verl's policy-loss API does not pass"


def scale_shape(like: Tensor, per_sequence: bool) -> tuple[int, ...]:
    return (like.shape[0], 1) if per_sequence else tuple(like.shape)


def scale_from_trainer(per_sequence: bool):
    """The trainer's value of the scale: 1 + a uniform draw from the micro-batch's stream off-policy, 1 on-policy."""

    def from_trainer(batch: TrainerBatch) -> Tensor:
        shape = scale_shape(batch.like, per_sequence)
        if batch.on_policy:
            return torch.ones(shape, dtype=batch.like.dtype)
        return 1 + torch.rand(shape, generator=batch.random())

    return from_trainer


def scale_extra(per_sequence: bool) -> Extra:
    """`token_scale` `[B, T]` or `sequence_scale` `[B, 1]` (its trainer side: `scale_from_trainer`)."""

    def fixture(like: Tensor, generator: torch.Generator) -> Tensor:
        return 1 + torch.rand(scale_shape(like, per_sequence), generator=generator, dtype=like.dtype)

    return Extra(
        name="sequence_scale" if per_sequence else "token_scale",
        meaning="[B, 1] float: a weight per sequence" if per_sequence else "[B, T] float: a weight per token",
        from_verl=Unavailable(REASON),
        fixture=fixture,
    )


def scaled_rule_class(per_sequence: bool) -> type[ClipRule]:
    extra = "sequence_scale" if per_sequence else "token_scale"

    class Scaled(ClipRule):
        """−w·A times a weight given as an extra (per token or per sequence)."""

        name = "test_sequence_scaled" if per_sequence else "test_scaled"
        family = "ratio"
        needs = (extra,)

        def terms(self, batch: TokenBatch, **extras: Tensor) -> RuleTerms:
            never = torch.zeros_like(batch.mask)
            loss = -ratio_from_log(batch.log_ratio) * batch.advantages * extras[extra]
            return RuleTerms(loss=loss, frozen_low=never, frozen_high=never)

    return Scaled


@contextmanager
def registered(rule_class: type[ClipRule], *extras: Extra, providers: dict | None = None) -> Iterator[ClipRule]:
    """The extras (with the trainer's `providers` of them, by name) and the rule, registered for the block (built at
    its defaults); the registries as before after."""
    added: list[str] = []
    try:
        for extra in extras:
            register_extra(extra)
            added.append(extra.name)
            if providers and extra.name in providers:
                register_trainer_extra(extra.name, providers[extra.name])
        register(rule_class)
        try:
            yield build_rule(rule_class.name)
        finally:
            del RULES[rule_class.name]
    finally:
        for name in added:
            del EXTRAS[name]
            TRAINER_PROVIDERS.pop(name, None)


def scaled_rule(per_sequence: bool = False):  # a context manager: `with scaled_rule(True) as rule:`
    extra = scale_extra(per_sequence)
    return registered(scaled_rule_class(per_sequence), extra, providers={extra.name: scale_from_trainer(per_sequence)})


# the truncation bound of the toy rule that owns the correction (the C_max of the TIS it reproduces)
OWNED_TIS_MAX = 2.0


class OwnedTIS(ClipRule):
    """−w·A·min(r, 2) with r = π_old/π_sampler from the sampling log-ratio it receives: token-level TIS, applied by
    the rule itself (`owns_correction`)."""

    name = "test_owned_tis"
    family = "reference"
    owns_correction = True

    def terms(self, batch: TokenBatch, sampling_log_ratio: Tensor, **_: object) -> RuleTerms:
        never = torch.zeros_like(batch.mask)
        weight = torch.exp(sampling_log_ratio).clamp(max=OWNED_TIS_MAX)
        loss = -ratio_from_log(batch.log_ratio) * batch.advantages * weight
        return RuleTerms(loss=loss, frozen_low=never, frozen_high=never)
