"""Started by tests/end_to_end/test_distributed_runs.py under torchrun: the SFT adapter of a launched run, asked for
as the GRPO stage asks for it (`distributed.main_first(lambda: ensure_sft_adapter(cfg))`), with an SFT stage that
outlasts the group's trainer.ddp_timeout. The stage is stubbed: it sleeps, then leaves an adapter marker.

    torchrun --standalone --nproc_per_node 2 tests/helpers/distributed_sft_wait.py RECORD_DIR DDP_TIMEOUT SFT_SECONDS

Each process writes RECORD_DIR/rank<k>.json with the adapter path it got, after a last collective of the group.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from atr_grpo import distributed
from atr_grpo.config_hydra import to_object
from atr_grpo.hydra_app import compose_train
from atr_grpo.training import sft


def slow_sft_stage(seconds: float):
    def run_stage(stage: str, staging: Path) -> None:
        assert stage == "sft"
        time.sleep(seconds)
        (staging / sft.ADAPTER_MARKER).write_text("{}")

    return run_stage


def main() -> None:
    record, timeout, seconds = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    overrides = ["experiment=smoke", f"trainer.ddp_timeout={timeout}", f"sft.cache_dir={record / 'sft'}"]
    cfg = to_object(compose_train(overrides))
    sft.run_stage = slow_sft_stage(seconds)
    with distributed.process_group(cfg.trainer.ddp_timeout):
        adapter = distributed.main_first(lambda: sft.ensure_sft_adapter(cfg))
        distributed.barrier()  # the group is still usable afterwards
        (record / f"rank{distributed.rank()}.json").write_text(json.dumps({"path": str(adapter)}))


if __name__ == "__main__":
    main()
