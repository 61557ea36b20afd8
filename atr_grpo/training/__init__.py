"""The training pipeline: SFT format stage, GRPO with the registered rule (TRL or Unsloth), logging, resume."""
