"""The verl plugin: every rule of the clipping registry as a verl policy loss, `loss_mode=atr_grpo.<rule>`.

verl (0.9.1) imports the `verl.plugins` entry points of installed packages on `import verl`, in the driver and
in every Ray worker; `pyproject.toml` declares this module there, so installing this package next to verl
registers the losses. Rule parameters come from verl's Hydra config through `ATRPolicyLossConfig`, verl's
`PolicyLossConfig` with one optional field per parameter name of the registry (unset = the rule's default):

    actor_rollout_ref.actor.policy_loss._target_=atr_grpo.integrations.verl.ATRPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=atr_grpo.atr
    +actor_rollout_ref.actor.policy_loss.delta=0.07

The config is validated by the rule when verl builds it (on the driver, before any model is loaded), and errors
name the verl key. The loss is the rule's per-token loss (times verl's rollout-correction weights when given;
verl's rejection, `rollout_rs`, reaches it as the rejected sequences' zeros in `response_mask`, which
`rollout.rejection` matches: tests_verl/test_rollout_rejection.py), reduced by verl's own `agg_loss` with the
global batch sizes verl hands it, so data parallelism and micro-batching normalise exactly as for verl's built-in
losses. Three of verl's `loss_agg_mode`s are ours:

    token-mean               ≡ token_mean   Σ ℓ / number of valid tokens in the mini-batch
    seq-mean-token-mean      ≡ seq_mean     mean over the mini-batch's sequences of Σ_t ℓ / |o_i|
    seq-mean-token-sum-norm  ≡ dr_grpo      Σ ℓ / (B · L) with L = actor.loss_scale_factor, which must be set

`token-sum` and `seq-mean-token-sum` have no counterpart here and are refused; a sequence-level rule under a
token sum runs with a warning (`check_aggregation`). A rule's extras come from their registry (`clipping.extras`),
which says how verl provides each or why it cannot: Clip-Cov's `key_seed` is drawn from a per-process
torch.Generator seeded from `actor.data_loader_seed` and the data-parallel rank, advanced by every call; `full_kl`
needs π_old's whole next-token distribution, which verl's policy-loss API does not carry, so `atr_grpo.full_kl` is
refused. A rule that owns the rollout correction (`ClipRule.owns_correction`) is refused too: verl hands a policy
loss its own correction weights, not the rollout engine's log-probs the rule needs. So is a rule whose batch statistic
is over the optimizer step's whole batch (`ClipRule.whole_batch`: M2PO, BAPO): verl calls a policy loss on each
micro-batch of each data-parallel rank.

Without verl the module still imports (the main environment has none); what needs verl raises an ImportError
that says how to get it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from atr_grpo.clipping import RULES, ClipRule, build_rule
from atr_grpo.clipping.extras import VerlCall, verl_extras, verl_refusals
from atr_grpo.losses import length_weighting
from atr_grpo.plugins import load_rule_plugins
from atr_grpo.rule_random import process_stream

LOSS_PREFIX = "atr_grpo."
ACTOR_KEY = "actor_rollout_ref.actor"
POLICY_LOSS_KEY = f"{ACTOR_KEY}.policy_loss"
CONFIG_TARGET = f"{__name__}.ATRPolicyLossConfig"
VERL_MISSING = (
    "the atr_grpo verl plugin needs verl, which this environment does not have (verl pins transformers<5.11, this "
    "package pins 5.17.0, so it lives in its own environment): run `make install-verl` and use .venv-verl/bin/python"
)

# verl's `loss_agg_mode` -> ours (`atr_grpo.losses.aggregate`): the same number when verl normalises by the
# global mini-batch (number of tokens, number of sequences, loss_scale_factor = our max_completion_length).
VERL_AGGREGATIONS = {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "seq_mean",
    "seq-mean-token-sum-norm": "dr_grpo",
}
# actor keys that verl's own losses read and ours do not: a changed value is reported, once per loss mode
VERL_ONLY_ACTOR_KEYS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")


def verl_available() -> bool:
    return importlib.util.find_spec("verl") is not None


def loss_mode_of(rule_name: str) -> str:
    return LOSS_PREFIX + rule_name


def rule_name_of(loss_mode: str) -> str | None:
    """The registry name behind `atr_grpo.<rule>`, None for any other loss mode."""
    return loss_mode[len(LOSS_PREFIX) :] if loss_mode.startswith(LOSS_PREFIX) else None


def param_names() -> tuple[str, ...]:
    """Every parameter name of every registered rule: the fields `ATRPolicyLossConfig` adds."""
    return tuple(sorted({p.name for rule in RULES.values() for p in rule.params}))


def _keys(names: list[str]) -> str:
    return ", ".join(f"{POLICY_LOSS_KEY}.{name}" for name in names)


def set_params(policy_loss: Any) -> dict[str, Any]:
    """The rule parameters set in a policy-loss config (ours, verl's, a DictConfig or a dict; None for none)."""
    if policy_loss is None:
        return {}
    values = {name: policy_loss.get(name) for name in param_names()}
    return {name: value for name, value in values.items() if value is not None}


# why a rule that owns the rollout correction (`ClipRule.owns_correction`) cannot run under verl
OWNED_CORRECTION_REASON = (
    "it applies the rollout correction itself, from the rollout engine's log-probs, and verl hands a policy loss "
    "only its own correction weights (rollout_is_weights)"
)


# why a rule whose statistic is over the optimizer step's whole batch (`ClipRule.whole_batch`) cannot run under verl
WHOLE_BATCH_REASON = (
    "its batch statistic is over the optimizer step's whole batch, and verl calls a policy loss on each micro-batch "
    "of each data-parallel rank"
)


def refusal(rule: type[ClipRule]) -> str | None:
    """Why a rule cannot run as a verl policy loss (an extra verl cannot supply, a correction of its own, or a
    statistic over the whole batch), or None."""
    missing = verl_refusals(rule.needs)
    if missing:
        what = "; ".join(f"{need!r}: {reason}" for need, reason in missing.items())
        why = f"needs the extra {what}"
    elif rule.owns_correction:
        why = OWNED_CORRECTION_REASON
    elif rule.whole_batch:
        why = WHOLE_BATCH_REASON
    else:
        return None
    return (
        f"{POLICY_LOSS_KEY}.loss_mode={loss_mode_of(rule.name)!r} is not available under verl: clipping rule "
        f"{rule.name!r} {why}; use it through `python -m atr_grpo.train` instead"
    )


def rule_from_config(loss_mode: str, policy_loss: Any) -> ClipRule:
    """Build the rule of `atr_grpo.<rule>` with the parameters set in `policy_loss`; errors name the verl key."""
    name = rule_name_of(loss_mode)
    if name not in RULES:
        allowed = ", ".join(loss_mode_of(rule) for rule in sorted(RULES))
        raise ValueError(f"{POLICY_LOSS_KEY}.loss_mode={loss_mode!r} is not an atr_grpo loss; allowed: {allowed}")
    rule = RULES[name]
    reason = refusal(rule)
    if reason:
        raise ValueError(reason)
    values = set_params(policy_loss)
    own = [p.name for p in rule.params]
    foreign = sorted(set(values) - set(own))
    if foreign:
        raise ValueError(
            f"{_keys(foreign)}: not a parameter of clipping rule {name!r} (loss_mode={loss_mode!r}); "
            f"its parameters: {', '.join(own) or '(none)'}"
        )
    try:
        return build_rule(name, **values)
    except ValueError as exc:
        bad = [p.name for p in rule.params if p.name in values and not p.check(values[p.name])] or sorted(values)
        raise ValueError(f"{_keys(bad)}: {exc}") from None


def check_aggregation(rule: ClipRule, loss_agg_mode: str, loss_scale_factor: int | None) -> str:
    """Our aggregation for verl's `loss_agg_mode`; ValueError naming the key where there is none. A sequence-level
    rule under a token-sum mode runs, as in our trainer, with a warning (once per rule and mode) that names the
    verl mode of the rule's own objective."""
    ours = VERL_AGGREGATIONS.get(loss_agg_mode)
    if ours is None:
        allowed = ", ".join(f"{verl} (= {mine})" for verl, mine in VERL_AGGREGATIONS.items())
        raise ValueError(
            f"{ACTOR_KEY}.loss_agg_mode={loss_agg_mode!r} has no counterpart among atr_grpo's aggregations; "
            f"allowed with atr_grpo losses: {allowed}"
        )
    notice = length_weighting(rule, ours)
    if notice is not None and (rule.name, loss_agg_mode) not in _WARNED:
        _WARNED.add((rule.name, loss_agg_mode))
        native_mode = next(verl for verl, mine in VERL_AGGREGATIONS.items() if mine == rule.native_aggregation)
        warnings.warn(
            f"{notice} ({ACTOR_KEY}.loss_agg_mode={loss_agg_mode!r}; set {native_mode} for the source's objective)",
            stacklevel=3,
        )
    if ours == "dr_grpo" and loss_scale_factor is None:
        raise ValueError(
            f"{ACTOR_KEY}.loss_agg_mode=seq-mean-token-sum-norm is Dr.GRPO only with a constant normaliser: set "
            f"{ACTOR_KEY}.loss_scale_factor to the maximum response length (data.max_response_length); without it "
            "verl divides by each micro-batch's padded length"
        )
    return ours


# ------------------------------------------------------------------------------------------- the loss
_GENERATORS: dict[str, torch.Generator] = {}
_WARNED: set[str | tuple[str, str]] = set()  # loss modes and (rule, aggregation) pairs already warned about


def _rank() -> int:
    distributed = torch.distributed
    return distributed.get_rank() if distributed.is_available() and distributed.is_initialized() else 0


def reset_key_generators() -> None:
    """Start every rule's random stream again from its seed (as a fresh process would)."""
    _GENERATORS.clear()


def rule_stream(rule: ClipRule, config: Any) -> torch.Generator:
    """The rule's random stream in this process (made on first use), advanced by each draw."""
    if rule.name not in _GENERATORS:
        _GENERATORS[rule.name] = process_stream(int(getattr(config, "data_loader_seed", 0)), _rank())
    return _GENERATORS[rule.name]


def rule_extras(rule: ClipRule, config: Any, log_prob: Tensor) -> dict[str, Any]:
    """The extras a rule needs, as the registry says verl provides them (`clipping.extras`)."""
    return verl_extras(rule.needs, VerlCall(like=log_prob, random=lambda: rule_stream(rule, config)))


def _warn_verl_only_keys(loss_mode: str, config: Any) -> None:
    """Say once per loss mode that verl's clip_ratio* keys, if changed, do not reach an atr_grpo rule."""
    if loss_mode in _WARNED:
        return
    _WARNED.add(loss_mode)
    defaults = {f.name: f.default for f in dataclasses.fields(ActorConfig)}
    changed = [key for key in VERL_ONLY_ACTOR_KEYS if getattr(config, key, defaults[key]) != defaults[key]]
    if changed:
        warnings.warn(
            f"{loss_mode} ignores {', '.join(f'{ACTOR_KEY}.{key}' for key in changed)} (verl's own losses read "
            f"them); set the rule's parameters under {POLICY_LOSS_KEY} with _target_={CONFIG_TARGET}",
            stacklevel=3,
        )


def policy_loss_fn(rule_name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """verl's `PolicyLossFn` for one rule of the registry."""
    loss_mode = loss_mode_of(rule_name)

    def compute_policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """`[B, T]` log-probs, advantages, mask (and IS weights) -> scalar loss, `actor/<metric>` floats."""
        if config is None:
            raise ValueError(f"loss_mode={loss_mode!r} needs verl's actor config (config=...)")
        rule = rule_from_config(loss_mode, getattr(config, "policy_loss", None))
        check_aggregation(rule, loss_agg_mode, config.global_batch_info.get("loss_scale_factor"))
        _warn_verl_only_keys(loss_mode, config)
        out = rule(log_prob, old_log_prob, advantages, response_mask, **rule_extras(rule, config, log_prob))
        per_token = out.loss if rollout_is_weights is None else out.loss * rollout_is_weights
        loss = agg_loss(
            loss_mat=per_token, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
        )
        return loss, {f"actor/{key}": value for key, value in out.metrics.items()}

    compute_policy_loss.__name__ = compute_policy_loss.__qualname__ = f"atr_grpo_{rule_name}_policy_loss"
    return compute_policy_loss


def register_policy_losses() -> list[str]:
    """Register `atr_grpo.<rule>` for every rule of the registry in verl's POLICY_LOSS_REGISTRY."""
    if not verl_available():
        raise ImportError(VERL_MISSING)
    modes = [loss_mode_of(name) for name in sorted(RULES)]
    for name, mode in zip(sorted(RULES), modes):
        register_policy_loss(mode)(policy_loss_fn(name))
    return modes


# ------------------------------------------------------------------------------------------- the config
def _validate_policy_loss(self: Any) -> None:
    """`ATRPolicyLossConfig.__post_init__`: the selected rule accepts the parameters set (before any model)."""
    values = set_params(self)
    if rule_name_of(self.loss_mode) is not None:
        rule_from_config(self.loss_mode, self)
    elif values:
        hint = f" (did you mean {loss_mode_of(self.loss_mode)!r}?)" if self.loss_mode in RULES else ""
        raise ValueError(
            f"{_keys(sorted(values))} set, but {POLICY_LOSS_KEY}.loss_mode={self.loss_mode!r} is not an atr_grpo "
            f"loss{hint}: the parameters only reach atr_grpo.<rule> losses. (With "
            "algorithm.rollout_correction.bypass_mode=true, verl replaces any loss_mode with 'bypass_mode'.)"
        )


def build_config_class(base: type) -> type:
    """verl's `PolicyLossConfig` plus one `Any = None` field per rule parameter name, validated on creation."""
    taken = {f.name for f in dataclasses.fields(base)}
    clash = sorted(taken.intersection(param_names()))
    if clash:
        raise RuntimeError(f"rule parameters {clash} clash with fields of verl's {base.__name__}; rename them")
    base_post_init = getattr(base, "__post_init__", None)

    def __post_init__(self: Any) -> None:
        if base_post_init is not None:
            base_post_init(self)
        _validate_policy_loss(self)

    fields = [(name, Any, dataclasses.field(default=None)) for name in param_names()]
    namespace = {
        "__module__": __name__,
        "__doc__": "verl's policy-loss config with the parameters of every atr_grpo rule (None = rule default).",
        "__post_init__": __post_init__,
    }
    return dataclasses.make_dataclass("ATRPolicyLossConfig", fields, bases=(base,), namespace=namespace)


if verl_available():
    from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
    from verl.workers.config import ActorConfig, PolicyLossConfig

    load_rule_plugins()  # the rules of installed packages are verl losses too
    ATRPolicyLossConfig = build_config_class(PolicyLossConfig)
    register_policy_losses()
else:

    def __getattr__(name: str) -> Any:
        if name == "ATRPolicyLossConfig":
            raise ImportError(VERL_MISSING)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
