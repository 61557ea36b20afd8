"""Started by tests/end_to_end/test_distributed_runs.py under torchrun: a smoke run through `run_training` (the GRPO
stage that `python -m atr_grpo.train` runs on each launched process), with probes the command line cannot add.

    torchrun --standalone --nproc_per_node 2 tests/helpers/distributed_probe.py RECORD_DIR KILL_STEP [override ...]

First, inside the process group, every process asks for the SFT adapter of a small SFT config with a cache of its
own (RECORD_DIR/sft), so that one of them trains it while the others wait: `sft.json` holds the path each got.
Then each process writes to RECORD_DIR/rank<k>/: `weights.jsonl` (a digest of its trainable weights before training
and after each optimizer step), `logs.jsonl` (what the trainer logged on that process) and `batch_<step>_<n>.pt`
(the tensors the rule saw in each of its micro-batches). Once the checkpoint of step KILL_STEP is on disk, every
process stops with an exception, as a preemption would (0: never).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import TrainerCallback

from atr_grpo import distributed
from atr_grpo.compat import keep_vllm_out_of_trl
from atr_grpo.config_hydra import to_object
from atr_grpo.hydra_app import compose_train
from atr_grpo.training.pipeline import run_training
from atr_grpo.training.rule_trainer import RuleTrainerMixin


class Preempted(Exception):
    pass


def weights_digest(model) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()


class Probe(TrainerCallback):
    def __init__(self, folder: Path, kill_step: int) -> None:
        self.folder, self.kill_step = folder, kill_step

    def _append(self, name: str, record: dict) -> None:
        with (self.folder / name).open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._append("weights.jsonl", {"step": state.global_step, "digest": weights_digest(model)})

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self._append("weights.jsonl", {"step": state.global_step, "digest": weights_digest(model)})

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._append("logs.jsonl", {"step": state.global_step, **(logs or {})})

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.kill_step:
            distributed.barrier()  # every process has written its part of the checkpoint (its RNG state)
            raise Preempted(f"stopped after the checkpoint of step {self.kill_step}")


def record_batches(folder: Path) -> None:
    """Keep every micro-batch the rule sees on this process, by the optimizer step it belongs to."""
    record_loss = RuleTrainerMixin.record_loss

    def recording(self, result, sampling_logp=None):
        step = self.state.global_step + 1
        count = len(list(folder.glob(f"batch_{step}_*.pt")))
        batch = result.batch
        tensors = {"logp": batch.logp, "old_logp": batch.old_logp, "advantages": batch.advantages, "mask": batch.mask}
        torch.save({k: v.detach().cpu() for k, v in tensors.items()}, folder / f"batch_{step}_{count}.pt")
        record_loss(self, result, sampling_logp)

    RuleTrainerMixin.record_loss = recording


def build_small_sft_adapter(record_dir: Path, overrides: tuple[str, ...], folder: Path) -> None:
    """The SFT adapter of a small SFT config in a fresh cache, asked for by every process (training.sft)."""
    from atr_grpo.training.sft import ensure_sft_adapter

    small = [*overrides, "sft.max_examples=64", "sft.num_epochs=1", f"sft.cache_dir={record_dir / 'sft'}"]
    path = distributed.main_first(lambda: ensure_sft_adapter(to_object(compose_train(small))))
    (folder / "sft.json").write_text(json.dumps({"path": str(path)}))


def main(record_dir: str, kill_step: str, *overrides: str) -> None:
    keep_vllm_out_of_trl()  # one config with HF rollouts per process, as under `python -m atr_grpo.train`
    folder = Path(record_dir) / f"rank{distributed.rank()}"
    folder.mkdir(parents=True, exist_ok=True)
    record_batches(folder)
    composed = compose_train(overrides)
    cfg = to_object(composed)
    with distributed.process_group(cfg.trainer.ddp_timeout):
        build_small_sft_adapter(Path(record_dir), overrides, folder)
        run_training(cfg, OmegaConf.to_yaml(composed, resolve=True), callbacks=[Probe(folder, int(kill_step))])


if __name__ == "__main__":
    main(*sys.argv[1:])
