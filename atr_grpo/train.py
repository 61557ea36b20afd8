"""`python -m atr_grpo.train [group=option ...] [key=value ...]`: one GRPO run (or a Hydra multirun sweep).

Compose the config, validate it (bad input stops here with its message and exit status 2, before any model
is loaded), then hand the plain dataclasses to `atr_grpo.training.pipeline.run_training`.
`--cfg job --resolve` prints the resolved config and loads nothing.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from atr_grpo.config import ConfigError, register_configs, to_object
from atr_grpo.hydra_app import run_app

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    try:
        train_cfg = to_object(cfg)
    except ConfigError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    from atr_grpo.training.pipeline import RunDirError, run_training

    try:
        run_training(train_cfg, OmegaConf.to_yaml(cfg, resolve=True))
    except (ConfigError, RunDirError) as err:
        print(err, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    sys.exit(run_app(main))
