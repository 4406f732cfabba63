"""Compose ``python run.py +experiment=<name>`` as a typed config that writes under a tmp dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import agents
from distrl.config import register_configs

REPO = Path(__file__).resolve().parents[1]


def compose_preset(tmp_path: Path, experiment: str, name: str, *overrides: str) -> Any:
    """The typed RunConfig of ``+experiment=<experiment>`` plus ``overrides``; logs and
    checkpoints go to ``tmp_path/name``, without tensorboard or timed checkpoints."""
    return compose_run(tmp_path, name, f"+experiment={experiment}", *overrides)


def compose_run(tmp_path: Path, name: str, *overrides: str) -> Any:
    """The typed RunConfig of ``python run.py <overrides>``, written under ``tmp_path/name``
    as in :func:`compose_preset`."""
    register_configs()
    agents.register_configs()
    with initialize_config_dir(str(REPO / "experiments"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    cfg = OmegaConf.to_object(cfg)
    cfg.log.dir, cfg.log.name, cfg.log.tensorboard = str(tmp_path), name, False
    cfg.log.interval_s = 30.0
    cfg.checkpoint.interval_s = 3600.0
    return cfg
