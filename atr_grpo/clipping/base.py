"""What every clipping rule shares: parameters, the registry, the token batch, metrics.

A rule is a small class whose `terms` method is a pure tensor function of per-token inputs: no
`.item()`, no Python branching on tensor values, so that the same code runs in eager mode (the TRL
path) and inside unsloth_zoo's `torch.compile(fullgraph=True)` loss (the Unsloth path). Every caller
goes through one method, `rule.apply(batch, **extras)`: it checks the extras, runs `terms` and masks the
loss. `losses.grpo_loss` (both trainer paths) calls it on a `make_batch`; calling the rule
(`rule(logp, old_logp, advantages, mask)`, the verl plugin and the tests) does the same and adds the
float metrics of the public `ClipOutput`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from atr_grpo.clipping.extras import SAMPLING_LOG_RATIO, check_needs, describe
from atr_grpo.clipping.param_names import param_name_problem

# exp(±20) ≈ 4.9e8 / 2.1e-9. Ratios are evaluated at the clamped log-ratio, but the clamp is a
# straight-through one (see `ratio_from_log`), so a token far outside keeps a gradient of bounded size.
LOG_RATIO_LIMIT = 20.0

SEMANTICS = ("min", "mask")

# What a rule constrains, for listings and for grouping rules in tests and benchmarks:
#   reference   no constraint at all (REINFORCE with the ratio)
#   ratio       an interval on the importance ratio (token or sequence), hard clip or clipped weight
#   divergence  a threshold on an estimate of the divergence between π_old and π_θ (the general operator)
#   covariance  a selection of tokens by their advantage/log-prob covariance, over the whole batch
#   soft        a smooth gate instead of a hard constraint
FAMILIES = ("reference", "ratio", "divergence", "covariance", "soft")

# the values of π_old(y_t|s_t) at which per-token bounds are printed
SAMPLE_OLD_PROBS = (0.9, 0.5, 0.1, 0.01)


# ----------------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class Param:
    """One hyperparameter of a rule: its default (from the source paper) and its valid range."""

    name: str
    default: Any
    allowed: str  # human-readable range, used in error messages ("> 0", "in (0, 1)", ...)
    check: Callable[[Any], bool]
    doc: str = ""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def value_type(param: Param) -> type:
    """The type of the parameter's values: float for a number whose check accepts a float, even with an int default
    (so a config may set `clipping.c=10.5`; an integer parameter's check refuses floats), else its default's type."""
    default = param.default
    if default is None or (_is_number(default) and param.check(float(default))):
        return float
    return type(default)


def positive(name: str, default: float, doc: str = "") -> Param:
    return Param(name, default, "a finite number > 0", lambda v: _is_number(v) and v > 0, doc)


def open_unit(name: str, default: float, doc: str = "") -> Param:
    return Param(name, default, "a number in (0, 1)", lambda v: _is_number(v) and 0 < v < 1, doc)


def fraction(name: str, default: float, doc: str = "") -> Param:
    return Param(name, default, "a number in (0, 1]", lambda v: _is_number(v) and 0 < v <= 1, doc)


def number(name: str, default: float, allowed: str, check: Callable[[float], bool], doc: str = "") -> Param:
    return Param(name, default, allowed, lambda v: _is_number(v) and check(v), doc)


def choice(name: str, default: str, options: tuple[str, ...], doc: str = "") -> Param:
    return Param(name, default, "one of " + ", ".join(repr(o) for o in options), lambda v: v in options, doc)


def semantics_param() -> Param:
    return choice(
        "semantics",
        "min",
        SEMANTICS,
        "'min': the general operator inside PPO's min (a violating token loses its gradient only on the "
        "side its advantage pushes; Thm 4.1). 'mask': it loses its gradient whenever the constraint fails.",
    )


def format_interval(low: float, high: float, variable: str = "w", digits: int = 3) -> str:
    """'w ∈ [0.671, 1.422]', with an unbounded side written as ∞."""
    upper = "∞)" if math.isinf(high) else f"{high:.{digits}f}]"
    return f"{variable} ∈ [{low:.{digits}f}, {upper}"


# ------------------------------------------------------------------------------------------ token batch
class TokenBatch(NamedTuple):
    """Per-token inputs after validation, all `[B, T]` float32 except `mask` (bool).

    Masked positions are sanitised to 0 in every float tensor, so a `-inf` log-prob in padding can
    never turn into a NaN gradient (`0 * inf`) through `exp` or products.
    """

    logp: Tensor  # log π_θ(y_t|s_t), carries the gradient
    old_logp: Tensor  # log π_old(y_t|s_t), no gradient
    log_ratio: Tensor  # logp - old_logp
    advantages: Tensor  # A_t broadcast to [B, T]
    mask: Tensor  # bool, True on completion tokens that count


def ratio_from_log(log_ratio: Tensor) -> Tensor:
    """w = exp(s) with s clamped to ±LOG_RATIO_LIMIT in value only.

    A plain `clamp` would zero the gradient of tokens beyond the limit; here the forward value is
    exp(clamp(s)) and the gradient is exp(clamp(s)) · ∂s, so extreme tokens stay finite *and* keep the
    direction of their gradient.
    """
    clamped = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(log_ratio + (clamped - log_ratio).detach())


def make_batch(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> TokenBatch:
    """Validate shapes, broadcast advantages, sanitise masked positions (pure tensor ops)."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp must match logp {tuple(logp.shape)}, got {tuple(old_logp.shape)}")
    if mask.shape != logp.shape:
        raise ValueError(f"mask must match logp {tuple(logp.shape)}, got {tuple(mask.shape)}")
    batch = logp.shape[0]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    if advantages.dim() != 2 or advantages.shape[0] != batch or advantages.shape[1] not in (1, logp.shape[1]):
        raise ValueError(f"advantages must be [B], [B, 1] or [B, T] with B={batch}, got {tuple(advantages.shape)}")
    valid = mask.bool()
    zero = logp.new_zeros(())
    logp = torch.where(valid, logp.float(), zero)
    old_logp = torch.where(valid, old_logp.detach().float(), zero)
    adv = torch.where(valid, advantages.detach().float().expand_as(logp), zero)
    return TokenBatch(logp, old_logp, logp - old_logp, adv, valid)


# ---------------------------------------------------------------------------------------------- outputs
@dataclass
class RuleTerms:
    """What a rule's pure tensor core returns; every tensor is `[B, T]`.

    `frozen_low` / `frozen_high`: tokens whose gradient the rule zeroes or truncates, split by the side
    of the trust region the ratio is on (ratio < 1 / ratio ≥ 1). `frozen_other`: tokens frozen for a
    reason that is not the ratio (Clip-Cov's covariance selection). `extra`: rule-specific per-token
    quantities, reported as their mean over valid tokens under the given metric name, or 0-d values of the
    whole batch (BAPO's bounds), reported as they are (0 when no token is valid, as a mean would be).
    """

    loss: Tensor
    frozen_low: Tensor
    frozen_high: Tensor
    frozen_other: Tensor | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ClipOutput:
    """The public result of a rule call: the per-token loss a trainer aggregates, and the metrics it logs."""

    loss: Tensor  # [B, T] per-token loss to minimise, 0 where mask == 0
    metrics: dict[str, float]


# the keys every rule emits (rules may add their own, e.g. clip/frac_dual, kl/estimate_mean)
METRIC_KEYS = ("clip/frac_low", "clip/frac_high", "clip/frac", "ratio/mean", "ratio/min", "ratio/max", "kl/kl3_mean")


def rule_metrics(batch: TokenBatch, terms: RuleTerms) -> dict[str, float]:
    """Token-weighted metrics over valid tokens, with one host sync for all of them.

    With no valid token at all, fractions are 0 and ratio statistics are 1 (nothing moved).
    """
    with torch.no_grad():
        valid = batch.mask
        count = valid.sum().clamp(min=1).float()
        frozen = terms.frozen_low | terms.frozen_high
        if terms.frozen_other is not None:
            frozen = frozen | terms.frozen_other
        log_ratio = batch.log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        ratio = torch.exp(log_ratio)
        any_valid = valid.any()
        one = ratio.new_ones(())
        stats = {
            "clip/frac_low": (terms.frozen_low & valid).sum() / count,
            "clip/frac_high": (terms.frozen_high & valid).sum() / count,
            "clip/frac": (frozen & valid).sum() / count,
            "ratio/mean": torch.where(any_valid, (ratio * valid).sum() / count, one),
            "ratio/min": torch.where(any_valid, torch.where(valid, ratio, math.inf).min(), one),
            "ratio/max": torch.where(any_valid, torch.where(valid, ratio, -math.inf).max(), one),
            # mean k3 estimate of KL(π_old ‖ π_θ): the approximate trust-region size of this update
            "kl/kl3_mean": torch.where(valid, torch.expm1(log_ratio) - log_ratio, 0.0).sum() / count,
        }
        for key, value in terms.extra.items():
            if value.dim() == 0:  # a value of the whole batch
                stats[key] = torch.where(any_valid, value.float(), 0.0)
                continue
            on_valid = value & valid if value.dtype == torch.bool else torch.where(valid, value.float(), 0.0)
            stats[key] = on_valid.sum() / count
        values = torch.stack([v.float() for v in stats.values()]).tolist()
    return dict(zip(stats.keys(), values))


# ---------------------------------------------------------------------------------------------- the rule
class ClipRule:
    """Base class. Subclasses set `name`, `family`, `params`, optionally the other traits, and implement `terms`."""

    name: ClassVar[str]
    family: ClassVar[str]  # one of FAMILIES
    params: ClassVar[tuple[Param, ...]] = ()
    needs: ClassVar[tuple[str, ...]] = ()  # names of the extras a call must pass (registered in `extras`)
    # True when the rule changes the gradient even where w ≡ 1 (strictly on-policy updates), i.e. its effect
    # does not go through the ratio; a run of any other rule warns that it cannot act when every update is on-policy
    acts_on_policy: ClassVar[bool] = False
    # the logged metric that is 0 at a step where the rule changed no token's gradient; None for a rule that
    # freezes no token and reshapes every one (a soft gate, a penalty): its clip/frac is 0 by construction
    act_metric: ClassVar[str | None] = "clip/frac"
    # the aggregation the rule's source defines its objective with (one of losses.AGGREGATIONS; "seq_mean" for the
    # sequence-level rules), None for token-level rules: `loss_agg=native` uses it (losses.resolve_aggregation)
    native_aggregation: ClassVar[str | None] = None
    # True when the rule applies the rollout correction itself (as TRL's VESPO does): `apply` then needs the input
    # SAMPLING_LOG_RATIO, and `losses.grpo_loss` multiplies no ρ on top. Both trainer paths give it (vLLM rollouts
    # only); the verl plugin refuses such a rule (verl hands a policy loss its own ρ, not the engine's log-probs)
    owns_correction: ClassVar[bool] = False
    # True when the rule computes a statistic over the whole batch it is given (Clip-Cov, KL-Cov: centred covariances
    # and a token quota), so that a sequence's loss depends on the other sequences. That batch is one micro-batch on
    # one process on the TRL, Unsloth and verl paths, never an optimizer step's batch nor all processes' together
    batch_statistic: ClassVar[bool] = False
    # True (with `batch_statistic`) when the source defines the statistic over the optimizer step's whole batch and
    # a part of it would give another rule (M2PO, BAPO): a run refuses what splits that batch before any model loads
    # (trainer.gradient_accumulation_steps > 1, several processes: `machine.decide`; verl's micro-batches: the verl
    # plugin), so that the micro-batch the rule receives is the step's batch. Clip-Cov and KL-Cov leave it False:
    # their source computes the statistic per micro-batch on each GPU, as here
    whole_batch: ClassVar[bool] = False
    summary: ClassVar[str] = ""  # one line: the constraint or loss (docs/framework.md, `python -m atr_grpo.clipping`)
    source: ClassVar[str] = ""  # the paper (and equation) the rule comes from

    def __init__(self, **values: Any) -> None:
        known = {p.name: p for p in self.params}
        for key in values:
            if key not in known:
                allowed = ", ".join(known) or "(none)"
                raise ValueError(f"clipping rule {self.name!r} has no parameter {key!r}; allowed: {allowed}")
        for param in self.params:
            value = values.get(param.name, param.default)
            if _is_number(value) and value_type(param) is float:
                value = float(value)
            if not param.check(value):
                raise ValueError(
                    f"clipping rule {self.name!r}: parameter {param.name!r} must be {param.allowed}, got {value!r}"
                )
            setattr(self, param.name, value)
        self.validate()

    def validate(self) -> None:
        """Cross-parameter checks (e.g. dual-clip's c > 1 + eps_high); raise ValueError naming the key."""

    def config(self) -> dict[str, Any]:
        return {p.name: getattr(self, p.name) for p in self.params}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"

    def terms(self, batch: TokenBatch, **extras: Any) -> RuleTerms:
        raise NotImplementedError

    def ratio_bounds(self) -> tuple[float, float] | None:
        """(low, high): the interval of w = π_θ/π_old outside which the rule stops following w (the token's
        gradient is zeroed on the side its advantage pushes, or its weight truncated), where the rule has one
        interval for every token; None otherwise (no constraint, per-token or per-sequence bounds, soft gates)."""
        return None

    def old_prob_bounds(self, old_prob: Tensor) -> tuple[Tensor, Tensor] | None:
        """For rules whose interval depends on the token's π_old(y_t|s_t): (low, high) of w for each value of
        `old_prob` (any shape, float64 recommended); None for every other rule."""
        return None

    def bounds_text(self) -> str:
        """The rule's trust region in words at its current parameters, e.g. 'δ = 0.07 ⇔ w ∈ [0.671, 1.422]'
        ('' when there is nothing to say beyond the summary)."""
        bounds = self.ratio_bounds()
        if bounds is not None:
            return format_interval(*bounds)
        per_token = self.old_prob_bounds(torch.tensor(SAMPLE_OLD_PROBS, dtype=torch.float64))
        if per_token is None:
            return ""
        lows, highs = (values.tolist() for values in per_token)
        return "; ".join(
            f"π_old {q:g}: {format_interval(low, high)}" for q, low, high in zip(SAMPLE_OLD_PROBS, lows, highs)
        )

    def check_extras(self, extras: dict[str, Any]) -> None:
        for need in self.needs:
            if extras.get(need) is None:
                raise ValueError(
                    f"clipping rule {self.name!r} needs the extra {describe(need)}; pass {need}=... in the call"
                )
        if self.owns_correction and extras.get(SAMPLING_LOG_RATIO) is None:
            raise ValueError(
                f"clipping rule {self.name!r} owns the rollout correction and needs {SAMPLING_LOG_RATIO!r} ([B, T] "
                f"float: log π_old − log π_sampler per token); pass {SAMPLING_LOG_RATIO}=... in the call "
                "(losses.grpo_loss makes it from sampling_logp)"
            )

    def apply(self, batch: TokenBatch, **extras: Any) -> tuple[Tensor, RuleTerms]:
        """The one way into a rule: the per-token loss `[B, T]`, 0 off the mask, and the terms it came from.

        A missing extra raises the named message. The check looks only at which extras are present, never at
        their values, so `apply` stays pure tensor code (it runs inside a fullgraph compile)."""
        self.check_extras(extras)
        terms = self.terms(batch, **extras)
        return torch.where(batch.mask, terms.loss, 0.0), terms

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, **extras: Any) -> ClipOutput:
        """Per-token loss `[B, T]` (gradient to `logp` only) and metrics over valid tokens."""
        batch = make_batch(logp, old_logp, advantages, mask)
        loss, terms = self.apply(batch, **extras)
        return ClipOutput(loss=loss, metrics=rule_metrics(batch, terms))


# ------------------------------------------------------------------------------------------- registry
RULES: dict[str, type[ClipRule]] = {}


def register(cls: type[ClipRule]) -> type[ClipRule]:
    """Class decorator: make a rule available by its `name` to `build_rule` and to the configs."""
    if cls.name in RULES:
        raise ValueError(f"clipping rule {cls.name!r} is registered twice")
    if getattr(cls, "family", None) not in FAMILIES:
        raise ValueError(f"clipping rule {cls.name!r}: family must be one of {', '.join(FAMILIES)}")
    check_needs(cls.name, cls.needs)
    if cls.whole_batch and not cls.batch_statistic:
        raise ValueError(f"clipping rule {cls.name!r}: whole_batch needs batch_statistic (a statistic over the batch)")
    attributes = {attribute for attribute in dir(cls) if not attribute.startswith("__")}
    names = [param.name for param in cls.params]
    for name in names:
        problem = param_name_problem(cls.name, name, attributes)
        if problem is not None:
            raise ValueError(problem)
        if names.count(name) > 1:
            raise ValueError(f"clipping rule {cls.name!r}: parameter {name!r} is declared twice")
    RULES[cls.name] = cls
    return cls


def registered(name: str) -> type[ClipRule]:
    """The rule class registered as `name`; ValueError listing the names when there is none."""
    if name not in RULES:
        raise ValueError(f"unknown clipping rule {name!r}; allowed: {', '.join(sorted(RULES))}")
    return RULES[name]


def build_rule(name: str, **params: Any) -> ClipRule:
    """Instantiate a registered rule; unknown names or bad parameters raise ValueError with the options."""
    return registered(name)(**params)


def rule_at_defaults(name: str) -> ClipRule:
    """The rule `name` at its source defaults, built once per process (per registered class): what the listings, the
    figures and the verl cross-check read; they never change it."""
    return _built_at_defaults(registered(name))


@functools.cache
def _built_at_defaults(rule_class: type[ClipRule]) -> ClipRule:
    return rule_class()


def rule_defaults(name: str) -> dict[str, Any]:
    """The source-paper defaults of a rule's parameters."""
    return {p.name: p.default for p in registered(name).params}
