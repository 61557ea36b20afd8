"""The verl plugin's checks that need no verl (the main environment has none; `make test-verl` runs the rest).

Parameters reach a rule from verl's config and are validated by the rule, with the verl key in every error;
verl's aggregation modes map to ours or are refused; rules whose extras verl cannot supply are refused.
"""

import warnings

import pytest
import torch

from atr_grpo.clipping import RULES, build_rule
from atr_grpo.clipping.extras import EXTRAS, Unavailable
from atr_grpo.clipping.kl import ATR
from atr_grpo.integrations import verl as plugin
from atr_grpo.losses import AGGREGATIONS


@pytest.mark.skipif(plugin.verl_available(), reason="verl is installed here: the import path without it is not")
def test_without_verl_the_module_imports_and_says_how_to_get_verl():
    """Importing works without verl; the config class and the registration raise an ImportError naming the fix."""
    with pytest.raises(ImportError, match=r"make install-verl.*\.venv-verl"):
        plugin.ATRPolicyLossConfig  # noqa: B018
    with pytest.raises(ImportError, match="make install-verl"):
        plugin.register_policy_losses()
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        plugin.nothing  # noqa: B018


def test_loss_modes_are_the_registry_names_with_the_prefix():
    """`atr_grpo.<rule>` round-trips to the rule name; verl's own loss modes are not ours."""
    for name in RULES:
        assert plugin.rule_name_of(plugin.loss_mode_of(name)) == name
    assert plugin.rule_name_of("vanilla") is None
    assert plugin.rule_name_of("clip_cov") is None  # verl's built-in, not ours


def test_config_class_fields_cover_every_parameter_of_every_rule():
    """Every parameter of every registered rule is a settable key (rules added later are picked up)."""
    names = set(plugin.param_names())
    for rule in RULES.values():
        assert {p.name for p in rule.params} <= names
    assert {"delta", "eps", "eps_low", "eps_high", "semantics"} <= names


def test_parameters_from_the_config_reach_the_rule():
    """Set values are passed to the rule; unset ones (None) leave the rule's source default."""
    rule = plugin.rule_from_config("atr_grpo.atr", {"delta": 0.05, "semantics": None})
    assert isinstance(rule, ATR) and rule.delta == 0.05 and rule.semantics == "min"
    assert plugin.rule_from_config("atr_grpo.clip_higher", None).config() == {"eps_low": 0.2, "eps_high": 0.28}
    assert plugin.rule_from_config("atr_grpo.dual_clip", {"c": 5}).c == 5.0


@pytest.mark.parametrize(
    ("values", "key", "allowed"),
    [
        ({"delta": -0.1}, "actor_rollout_ref.actor.policy_loss.delta", "> 0"),
        ({"delta": 0.0}, "actor_rollout_ref.actor.policy_loss.delta", "> 0"),
        ({"semantics": "both"}, "actor_rollout_ref.actor.policy_loss.semantics", "'min', 'mask'"),
    ],
)
def test_bad_parameter_is_refused_naming_the_verl_key(values, key, allowed):
    """A value outside the rule's range fails with the full verl key and the allowed values."""
    with pytest.raises(ValueError, match="parameter") as error:
        plugin.rule_from_config("atr_grpo.atr", values)
    assert str(error.value).startswith(key + ":") and allowed in str(error.value)


def test_cross_parameter_check_names_the_keys_set():
    """Dual-clip's c must exceed 1 + eps_high: the rule's own check, reported under the verl keys."""
    with pytest.raises(ValueError, match=r"policy_loss\.c, actor_rollout_ref\.actor\.policy_loss\.eps_high: .*'c'"):
        plugin.rule_from_config("atr_grpo.dual_clip", {"c": 1.1, "eps_high": 0.2})


def test_parameter_of_another_rule_is_refused():
    """δ set for a ratio rule is an error that lists the rule's own parameters, not a silent no-op."""
    with pytest.raises(ValueError, match=r"policy_loss\.delta: not a parameter of clipping rule 'clip'.*: eps$"):
        plugin.rule_from_config("atr_grpo.clip", {"delta": 0.05})


def test_unknown_rule_is_refused_with_the_allowed_loss_modes():
    with pytest.raises(ValueError, match=r"'atr_grpo\.atrr' is not an atr_grpo loss; allowed: .*atr_grpo\.atr"):
        plugin.rule_from_config("atr_grpo.atrr", {})


def test_full_kl_is_refused_because_verl_has_no_full_distribution():
    """Full-KL needs π_old's whole next-token distribution, which verl's policy-loss API does not pass."""
    with pytest.raises(ValueError, match=r"'atr_grpo\.full_kl' is not available under verl.*full next-token"):
        plugin.rule_from_config("atr_grpo.full_kl", {})
    assert plugin.refusal(RULES["full_kl"]) is not None


def test_only_rules_needing_an_extra_verl_cannot_supply_are_refused():
    """Clip-Cov's key seed is supplied (from a seeded generator); a rule is refused exactly when one of its extras is
    `Unavailable` under verl, when it owns the rollout correction (test_owned_correction), or when its statistic is
    over the whole batch (`whole_batch`: verl calls a loss per micro-batch)."""
    refused = {name for name, rule in RULES.items() if plugin.refusal(rule)}
    unavailable = {name for name, extra in EXTRAS.items() if isinstance(extra.from_verl, Unavailable)}
    expected = {
        name
        for name, rule in RULES.items()
        if unavailable.intersection(rule.needs) or rule.owns_correction or rule.whole_batch
    }
    assert refused == expected
    assert "clip_cov" not in refused and "full_kl" in refused


def test_process_stream_depends_on_seed_and_rank_only():
    """Same (seed, rank) -> the same stream; another seed or rank -> another stream; the draws are those of the
    plugin's own generator before the trainer and verl shared one factory (`rule_random`)."""
    import hashlib

    def draws(generator):
        return [int(v) for v in torch.randint(0, 2**31 - 1, (4,), generator=generator)]

    legacy = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(b"3:0").digest()[:4], "little"))
    assert draws(plugin.process_stream(3, 0)) == draws(legacy)
    assert draws(plugin.process_stream(3, 0)) == draws(plugin.process_stream(3, 0))
    assert draws(plugin.process_stream(3, 0)) != draws(plugin.process_stream(4, 0))
    assert draws(plugin.process_stream(3, 0)) != draws(plugin.process_stream(3, 1))


def test_verl_aggregations_map_onto_ours():
    """The three mapped modes are exactly our three aggregations."""
    assert sorted(plugin.VERL_AGGREGATIONS.values()) == sorted(AGGREGATIONS)
    rule = build_rule("atr")
    for verl_mode, ours in plugin.VERL_AGGREGATIONS.items():
        assert plugin.check_aggregation(rule, verl_mode, loss_scale_factor=1536) == ours


@pytest.mark.parametrize("mode", ["token-sum", "seq-mean-token-sum", "token_mean"])
def test_unmapped_aggregation_is_refused_naming_the_key(mode):
    with pytest.raises(ValueError, match=rf"actor_rollout_ref\.actor\.loss_agg_mode='{mode}' has no counterpart"):
        plugin.check_aggregation(build_rule("atr"), mode, loss_scale_factor=1536)


def test_dr_grpo_needs_a_constant_normaliser():
    """seq-mean-token-sum-norm without loss_scale_factor would divide by each micro-batch's padded length."""
    with pytest.raises(ValueError, match=r"set actor_rollout_ref\.actor\.loss_scale_factor"):
        plugin.check_aggregation(build_rule("atr"), "seq-mean-token-sum-norm", loss_scale_factor=None)


def test_sequence_rule_under_a_token_sum_runs_with_one_warning(monkeypatch):
    """GSPO (defined with seq_mean) runs under every mapped verl mode, as in our trainer; under the two token sums
    verl users are told once per mode, naming the key and the mode of GSPO's own objective."""
    monkeypatch.setattr(plugin, "_WARNED", set())
    rule = build_rule("gspo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plugin.check_aggregation(rule, "seq-mean-token-mean", None) == "seq_mean"
        assert plugin.check_aggregation(build_rule("atr"), "token-mean", None) == "token_mean"
    with pytest.warns(UserWarning) as caught:
        assert plugin.check_aggregation(rule, "token-mean", None) == "token_mean"
        assert plugin.check_aggregation(rule, "token-mean", None) == "token_mean"
        assert plugin.check_aggregation(rule, "seq-mean-token-sum-norm", 1536) == "dr_grpo"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert "'gspo' is defined per sequence with seq_mean aggregation" in messages[0]
    assert "actor_rollout_ref.actor.loss_agg_mode='token-mean'; set seq-mean-token-mean" in messages[0]
    assert "loss_agg_mode='seq-mean-token-sum-norm'" in messages[1]
