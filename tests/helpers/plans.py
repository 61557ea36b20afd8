"""A minimal analysis plan (`reporting.plan`) with a final evaluation, for the tests of `final_eval` and
`reproduce`; each test changes the keys it is about."""

from __future__ import annotations

FINAL = {"folder": "final_eval", "temperature": 0.3, "top_p": 0.95}


def plan_with_final_evaluation(**changes) -> dict:
    """The plan as a dict: primary atr − clip, no secondaries, Mean@8 on arithmetic, the final evaluation at 0.3."""
    return {
        "experiment": "power",
        "seeds": [0],
        "endpoint": "auc",
        "metric": "mean@8",
        "benchmark": "arithmetic",
        "test": "seed_sign_flip",
        "alpha": 0.05,
        "equivalence_margin": 0.5,
        "primary": ["atr", "clip"],
        "secondary": [],
        "final_evaluation": dict(FINAL),
        **changes,
    }
