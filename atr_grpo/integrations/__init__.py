"""Bridges from the clipping registry to other RL engines (`atr_grpo.integrations.verl`: verl's policy losses).

Nothing here is imported by the rest of the package: each bridge imports its engine itself, and only when the
engine is installed.
"""
