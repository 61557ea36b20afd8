"""Tables and figures rebuilt from run directories (`python -m atr_grpo.results`)."""
