"""Datasets and the one prompt format shared by SFT, GRPO and evaluation."""
