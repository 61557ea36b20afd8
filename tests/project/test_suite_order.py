"""How the suite runs (tests/conftest.py): the order `make test` hands test files to its workers (longest first, by
earlier runs), and the rules `make test-fast` runs through the compiled loss (by behaviour, not by name)."""

import pytest
import torch
from conftest import longest_files_first, rules_of_each_kind

from atr_grpo.clipping import RULES, ClipRule, RuleTerms, TokenBatch, ratio_from_log


def test_files_go_longest_first_each_in_one_piece_and_a_file_never_timed_before_all():
    """A file is the path before `::` in a node id, its folder under tests/ included."""
    a, b, c, d, e = "tests/x/a.py", "tests/y/b.py", "tests/x/c.py", "tests/y/d.py", "tests/z/e.py"
    nodeids = [f"{a}::one", f"{a}::two", f"{b}::one", f"{c}::one", f"{c}::two", f"{d}::one", f"{e}::one"]
    recorded = {f"{a}::one": 1.0, f"{a}::two": 2.0, f"{b}::one": 10.0, f"{c}::one": 4.0, f"{d}::one": 0.5}
    recorded[f"{e}::one"] = 3.0  # as long as tests/x/a.py: the two keep their collection order
    assert longest_files_first(nodeids, recorded) == [
        f"{c}::one",  # c.py::two was never timed
        f"{c}::two",
        f"{b}::one",
        f"{a}::one",
        f"{a}::two",
        f"{e}::one",
        f"{d}::one",
    ]


def rule_class(name: str, family: str, sequence: bool = False, **traits) -> type[ClipRule]:
    """A rule −w·A (REINFORCE with the ratio), or, with `sequence=True`, −w·A times its sequence's mean ratio."""

    def terms(self, batch: TokenBatch, **_: object) -> RuleTerms:
        ratio = ratio_from_log(batch.log_ratio)
        if sequence:
            ratio = ratio * (ratio * batch.mask).sum(dim=1, keepdim=True) / batch.mask.sum(dim=1, keepdim=True)
        never = torch.zeros_like(batch.mask)
        return RuleTerms(loss=-ratio * batch.advantages, frozen_low=never, frozen_high=never)

    return type(name, (ClipRule,), {"name": name, "family": family, "terms": terms, **traits})


@pytest.mark.parametrize(
    "traits",
    [{"native_aggregation": "seq_mean"}, {"acts_on_policy": True}, {"needs": ("key_seed",)}, {"sequence": True}],
)
def test_a_rule_with_a_trait_or_coupled_tokens_is_compiled_by_the_fast_suite(monkeypatch, traits):
    """Whatever its name (here the last of its family): a rule with a trait set, or whose tokens' gradients depend
    on each other although it declares nothing, is among the fast suite's rules; a plain one in a family that
    already has a plain rule is not."""
    monkeypatch.setitem(RULES, "zz_risky", rule_class("zz_risky", "ratio", **traits))
    monkeypatch.setitem(RULES, "zz_plain", rule_class("zz_plain", "ratio"))
    chosen = rules_of_each_kind()
    assert "zz_risky" in chosen and "zz_plain" not in chosen
    assert "atr" in chosen and {RULES[name].family for name in chosen} == {rule.family for rule in RULES.values()}
