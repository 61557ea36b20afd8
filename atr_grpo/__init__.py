"""atr-grpo: a unified framework of policy-divergence clipping rules for GRPO, and the harness to compare them.

Entry points: `python -m atr_grpo.train`, `python -m atr_grpo.evaluate`, `python -m atr_grpo.results`.
The clipping rules live in `atr_grpo.clipping` (one registry), the losses' aggregation in `atr_grpo.losses`.
"""

__version__ = "0.1.0"
