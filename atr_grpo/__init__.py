"""atr-grpo: a unified framework of policy-divergence clipping rules for GRPO, and the harness to compare them.

Entry points: `python -m atr_grpo.train`, `python -m atr_grpo.evaluate`, `python -m atr_grpo.results`.
The clipping rules live in `atr_grpo.clipping` (one registry), the losses' aggregation in `atr_grpo.losses`.
"""

import os

__version__ = "0.1.0"

# Idle OpenMP threads sleep instead of spinning, so that runs sharing the cores with other jobs do not stall each
# other (`make bench-wait`). Set here, before any entry point imports torch; a policy set by the user is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
