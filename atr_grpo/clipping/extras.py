"""The extra inputs a rule may need beyond the per-token log-probs, advantages and mask: each declared once, here.

A rule names the extras it needs (`needs = ("full_kl",)`) and receives each as a keyword argument of that name.
Each name is one `Extra`, which says
- `from_verl`: how the verl plugin provides it from what verl hands a policy loss (a `VerlCall`), or, as
  `Unavailable`, why it cannot: the plugin then refuses every rule that needs it, with that reason;
- `fixture`: a valid value for a batch shaped like a given `[B, T]` tensor (tests, `scripts/bench_loss.py`).

How our trainer provides an extra may run the model (π_old's full-vocabulary KL does), so that side lives in
`training.extras` (`register_trainer_extra`), not here: this package stays pure tensor code.

`register` (the rules' decorator) refuses a rule that needs an unregistered extra. A new extra is one
`register_extra(Extra(...))` below, its trainer provider, the rule that names it, and a test: nothing else
dispatches on its name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class VerlCall:
    """What the verl plugin knows at a policy-loss call."""

    like: Tensor  # [B, T]: verl's log-probs
    # the rule's random stream in this process, seeded from (actor.data_loader_seed, data-parallel rank) and advanced
    # by every call
    random: Callable[[], torch.Generator]


@dataclass(frozen=True)
class Unavailable:
    """An extra that a side cannot provide, and why (the refusal names it)."""

    reason: str


@dataclass(frozen=True)
class Extra:
    name: str  # the keyword the rule receives
    meaning: str  # what the value is, with its shape
    from_verl: Callable[[VerlCall], Any] | Unavailable
    fixture: Callable[[Tensor, torch.Generator], Any]  # (like [B, T] float, a seeded generator) → a valid value


EXTRAS: dict[str, Extra] = {}

# the input a rule with `owns_correction` receives: log π_old − log π_sampler `[B, T]` (rollout_correction.py). It is
# not an extra: `losses.grpo_loss` makes it from the engine's log-probs, and the verl plugin refuses such a rule
SAMPLING_LOG_RATIO = "sampling_log_ratio"


def register_extra(extra: Extra) -> Extra:
    if extra.name in EXTRAS:
        raise ValueError(f"extra {extra.name!r} is registered twice")
    EXTRAS[extra.name] = extra
    return extra


def check_needs(rule_name: str, needs: Iterable[str]) -> None:
    """Every extra a rule needs is registered; ValueError naming the rule, the extra and the registered ones."""
    for name in needs:
        if name not in EXTRAS:
            raise ValueError(
                f"clipping rule {rule_name!r} needs the extra {name!r}, which is not registered; registered extras: "
                f"{', '.join(sorted(EXTRAS)) or '(none)'} (add one with clipping.extras.register_extra)"
            )


def describe(name: str) -> str:
    """'name' (what it is), for error messages."""
    extra = EXTRAS.get(name)
    return f"{name!r}" if extra is None else f"{name!r} ({extra.meaning})"


def verl_refusals(needs: Iterable[str]) -> dict[str, str]:
    """{extra: why verl cannot provide it} for the extras `needs` names that verl cannot provide."""
    sources = {name: EXTRAS[name].from_verl for name in needs}
    return {name: source.reason for name, source in sources.items() if isinstance(source, Unavailable)}


def verl_extras(needs: Iterable[str], call: VerlCall) -> dict[str, Any]:
    """The extras `needs` names, as the verl plugin provides them at `call`."""
    values = {}
    for name in needs:
        source = EXTRAS[name].from_verl
        if isinstance(source, Unavailable):
            raise ValueError(f"the extra {name!r} is not available under verl: {source.reason}")
        values[name] = source(call)
    return values


def fixture_extras(needs: Iterable[str], like: Tensor, seed: int = 0, owns_correction: bool = False) -> dict[str, Any]:
    """Valid values of the extras `needs` names for a batch shaped like `like` (`[B, T]` float), each drawn from a
    generator seeded with `seed`; with `owns_correction` (the rule's trait) also SAMPLING_LOG_RATIO, a sampler that
    differs from π_old by |log r| of about 0.1 per token."""
    values = {name: EXTRAS[name].fixture(like, torch.Generator().manual_seed(seed)) for name in needs}
    if owns_correction:
        generator = torch.Generator().manual_seed(seed)
        values[SAMPLING_LOG_RATIO] = 0.1 * torch.randn(like.shape, generator=generator, dtype=like.dtype)
    return values


# ------------------------------------------------------------------------------------------- the extras
# K of DPPO's top-K estimates (the extras `topk_tv` and `topk_kl`): 20, as CPPO's authors use it with DPPO's top-K
# construction (arXiv 2606.10968, §4.1); DPPO's released code leaves K to the rollout's `logprobs` setting
TOPK_K = 20


def key_seed_from(generator: torch.Generator) -> Tensor:
    """The 0-d seed of Clip-Cov's hashed keys, drawn from a generator (how a seeded stream becomes a tensor input,
    which compiled code can take)."""
    return torch.randint(0, 2**31 - 1, (), generator=generator, device=generator.device)


register_extra(
    Extra(
        name="key_seed",
        meaning="0-d int64 tensor: the seed of a randomised rule's per-token keys",
        from_verl=lambda call: key_seed_from(call.random()),
        fixture=lambda like, generator: key_seed_from(generator),
    )
)

register_extra(
    Extra(
        name="full_kl",
        meaning="[B, T] float: KL(π_old(·|s_t) ‖ π_θ(·|s_t)) over the whole vocabulary at each completion token",
        from_verl=Unavailable(
            "π_old's full next-token distribution (verl passes the old log-probs of the sampled tokens only)"
        ),
        fixture=lambda like, generator: torch.rand(like.shape, generator=generator, dtype=like.dtype) * 0.2,
    )
)

register_extra(
    Extra(
        name="token_entropy",
        meaning="[B, T] float: the entropy of π_θ(·|s_t) over the whole vocabulary at each completion token, detached",
        from_verl=Unavailable("π_θ's per-token entropy (verl's policy-loss API passes log-probs, not the entropy)"),
        fixture=lambda like, generator: torch.rand(like.shape, generator=generator, dtype=like.dtype) * 2.0,
    )
)

register_extra(
    Extra(
        name="entropy_ratio",
        meaning=(
            "[B, T] float: H(π_θ(·|s_t)) / H(π_old(·|s_t)), the ratio of the two full-vocabulary entropies at each "
            "completion token (ERC's, with 1e-8 added to both), detached"
        ),
        from_verl=Unavailable("π_old's and π_θ's per-token entropies (verl's policy-loss API passes log-probs only)"),
        fixture=lambda like, generator: 0.9 + 0.2 * torch.rand(like.shape, generator=generator, dtype=like.dtype),
    )
)

for _name, _what in (("topk_tv", "total variation"), ("topk_kl", "KL(π_old ‖ π_θ)")):
    register_extra(
        Extra(
            name=_name,
            meaning=(
                f"[B, T] float: the {_what} between π_old(·|s_t) and π_θ(·|s_t) over π_old's top {TOPK_K} tokens, the "
                "sampled token and the rest of the vocabulary as one category (DPPO's top-K estimate)"
            ),
            from_verl=Unavailable("π_old's and π_θ's top-K log-probs (verl passes the sampled tokens' log-probs only)"),
            fixture=lambda like, generator: torch.rand(like.shape, generator=generator, dtype=like.dtype) * 0.2,
        )
    )
