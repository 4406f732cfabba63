"""Train an agent: ``python run.py agent=impala env=Pong`` (Hydra; ``-m seed=0,1,2`` sweeps)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

import agents
from distrl.checkpoint import CheckpointError
from distrl.config import ConfigError, register_configs
from distrl.resume_settings import settings_of_run

register_configs()
agents.register_configs()


def to_run_config(cfg: DictConfig) -> object:
    """Instantiate the typed dataclasses, which validates every field."""
    return OmegaConf.to_object(cfg)


@hydra.main(version_base="1.3", config_path="experiments", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        run_cfg = to_run_config(settings_of_run(cfg))  # resume: the checkpoint's settings
        agents.get(run_cfg.agent.name).run(run_cfg)
    except (ConfigError, CheckpointError) as error:
        print(f"distrl: error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
