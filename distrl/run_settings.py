"""The run's settings beside the agent's: topology, logging, checkpoints, seed, budget."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from distrl import distributed
from distrl.config import CheckpointConfig, DistributedConfig, EnvConfig, EvalConfig, LogConfig


@dataclass
class RunSettings:
    """Topology, logging and checkpoint settings plus the run's identity."""

    env: EnvConfig
    distributed: DistributedConfig
    log: LogConfig
    checkpoint: CheckpointConfig
    seed: int
    total_frames: int
    resume: str | None = None
    config_text: str = ""  # the resolved config, stored in tensorboard and checkpoints
    kernel: str = "auto"  # compiled ops or the torch reference (distrl.ops)
    stop_at_return: float | None = None  # end once the last 20 episodes' mean reaches it
    evaluation: EvalConfig = dataclasses.field(default_factory=EvalConfig)  # after the run

    @classmethod
    def from_config(cls, cfg: Any, terminal_on_life_loss: bool = False) -> RunSettings:
        """The settings of a :class:`distrl.config.RunConfig` (typed or an OmegaConf node);
        ``terminal_on_life_loss`` is the agent's paper's choice, taken where
        ``env.terminal_on_life_loss`` is None."""
        env = cfg.env if isinstance(cfg.env, EnvConfig) else OmegaConf.to_object(cfg.env)
        if env.terminal_on_life_loss is None:
            env = dataclasses.replace(env, terminal_on_life_loss=terminal_on_life_loss)
        return cls(env=env, distributed=cfg.distributed, log=cfg.log,
                   checkpoint=cfg.checkpoint, seed=cfg.seed, total_frames=cfg.total_frames,
                   resume=cfg.resume, config_text=OmegaConf.to_yaml(OmegaConf.structured(cfg)),
                   kernel=cfg.kernel, stop_at_return=cfg.stop_at_return,
                   evaluation=cfg.eval)

    @property
    def envs_per_group(self) -> int:
        """Envs one env group steps as a batch: envs_per_actor / env_groups."""
        return self.distributed.envs_per_actor // self.distributed.env_groups


def settings_for_rank(settings: RunSettings, ranks: distributed.RankInfo | None) -> RunSettings:
    """The settings a rank's actors use: another seed per rank, so ranks play other episodes."""
    if ranks is None:
        return settings
    return dataclasses.replace(settings, seed=settings.seed + 7_919 * ranks.rank)


def seed_everything(seed: int) -> None:
    """Seed Python, numpy (which takes only 32 bits) and torch from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**63)
